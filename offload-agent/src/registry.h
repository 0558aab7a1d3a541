// Registry: the one way the agent's plug points (eviction policies, device backends, disk I/O
// backends) map a name from the configuration to a factory. Thread-safe: Register, Create and
// Names may be called from any thread.
//
// Each kind's registry is a function-local static whose constructor registers that kind's
// built-ins from an explicit table (see eviction_policy.cc, device.cc, disk_io.cc), not from
// self-registering namespace-scope objects in each implementation file:
//   - static-initialisation order: a static object in one file that registers into a map in
//     another file may run before that map exists, and code that reads the registry from its
//     own static initialiser may run before the registering file's. A function-local static is
//     built on first use, under the compiler's one-time-init guard, so every reader sees the
//     complete set of built-ins whatever the order;
//   - dead-stripping: a linker pulling objects from a static archive keeps only those something
//     references, and nothing references a file whose only job is to register itself, so its
//     policy silently vanished (the library had to be an OBJECT library to avoid it). The table
//     references every built-in factory, so they are linked however the library is packaged.
// The cost is one line in the table per new built-in; tests and embedders still Register their
// own at run time.
#ifndef KVOFFLOAD_SRC_REGISTRY_H_
#define KVOFFLOAD_SRC_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvoffload/status.h"
#include "kvoffload/mutex.h"

namespace kvoffload {

// Names are lowercase letters, digits and '-' ("chain-lru"), so that a list joined with ", "
// or "," (kvo_policy_names) splits back into the same names.
inline bool IsValidRegistryName(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

// Product: the interface the factories build; Args: what Create passes on to them.
template <typename Product, typename... Args>
class Registry {
 public:
  using Factory = std::function<Result<std::unique_ptr<Product>>(Args...)>;

  // kind names the plug point in errors: "eviction policy", "device backend".
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // False when the name is taken, is not a valid name (IsValidRegistryName) or the factory is
  // empty.
  bool Register(std::string_view name, Factory factory) EXCLUDES(mu_) {
    if (!IsValidRegistryName(name) || !factory) return false;
    MutexLock lock(&mu_);
    return factories_.emplace(std::string(name), std::move(factory)).second;
  }

  bool Contains(std::string_view name) const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return factories_.find(name) != factories_.end();
  }

  // Sorted.
  std::vector<std::string> Names() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::vector<std::string> names;
    names.reserve(factories_.size());
    for (const auto& entry : factories_) names.push_back(entry.first);
    return names;
  }

  // "arc, chain-lru, lru"
  std::string JoinedNames() const {
    std::string joined;
    for (const std::string& n : Names()) joined += (joined.empty() ? "" : ", ") + n;
    return joined;
  }

  // InvalidArgument for a name that is not registered, listing the registered ones:
  // `<field>="<name>" is not a known <kind>; use one of: ...` where the caller names the field
  // the user set (KVOFFLOAD_EVICTION_POLICY), else `<kind> "<name>" is not known; ...`.
  Status Unknown(std::string_view name, std::string_view field = {}) const {
    const std::string quoted = "\"" + std::string(name) + "\"";
    return Status::InvalidArgument(
        (field.empty() ? kind_ + " " + quoted + " is not known"
                       : std::string(field) + "=" + quoted + " is not a known " + kind_) +
        "; use one of: " + JoinedNames());
  }

  // Runs the factory registered as `name` (outside the lock: a factory may be slow or consult
  // a registry itself); Unknown(name) when there is none.
  Result<std::unique_ptr<Product>> Create(std::string_view name, Args... args) const
      EXCLUDES(mu_) {
    Factory factory;
    {
      MutexLock lock(&mu_);
      auto it = factories_.find(name);
      if (it != factories_.end()) factory = it->second;
    }
    if (!factory) return Unknown(name);
    return factory(std::forward<Args>(args)...);
  }

 private:
  const std::string kind_;
  mutable Mutex mu_;
  std::map<std::string, Factory, std::less<>> factories_ GUARDED_BY(mu_);
};

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_REGISTRY_H_
