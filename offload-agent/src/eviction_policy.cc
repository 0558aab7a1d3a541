// The name-keyed registry of eviction policies. Each policy file registers itself, so adding a
// policy touches no other source file.
#include <map>

#include "kvoffload/eviction_policy.h"
#include "mutex.h"

namespace kvoffload {
namespace {

struct Registry {
  Mutex mu;
  std::map<std::string, EvictionPolicyFactory, std::less<>> factories GUARDED_BY(mu);
};

// Function-local so registration from other translation units' static initialisers is safe.
Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used during static teardown
  return *registry;
}

}  // namespace

void EvictionPolicy::OnInsertAt(const BlockKey& key, uint32_t /*position*/) { OnInsert(key); }
void EvictionPolicy::OnAccessAt(const BlockKey& key, uint32_t /*position*/) { OnAccess(key); }
void EvictionPolicy::OnHold(const BlockKey& /*key*/) {}
void EvictionPolicy::OnRelease(const BlockKey& /*key*/) {}

bool RegisterEvictionPolicy(std::string_view name, EvictionPolicyFactory factory) {
  Registry& r = GetRegistry();
  MutexLock lock(&r.mu);
  return r.factories.emplace(std::string(name), factory).second;
}

std::vector<std::string> EvictionPolicyNames() {
  Registry& r = GetRegistry();
  MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

Result<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(std::string_view name,
                                                          size_t capacity_blocks) {
  EvictionPolicyFactory factory = nullptr;
  {
    Registry& r = GetRegistry();
    MutexLock lock(&r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (factory == nullptr) {
    std::string known;
    for (const std::string& n : EvictionPolicyNames()) known += (known.empty() ? "" : ", ") + n;
    return Status::InvalidArgument("eviction policy \"" + std::string(name) +
                                   "\" is not known; use one of: " + known);
  }
  if (capacity_blocks == 0) {
    return Status::InvalidArgument("eviction policy \"" + std::string(name) +
                                   "\": capacity must hold at least one block");
  }
  return factory(capacity_blocks);
}

}  // namespace kvoffload
