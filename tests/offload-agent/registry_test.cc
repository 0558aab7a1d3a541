// The plug-point registries (src/registry.h): each lists exactly its built-ins, an unknown name's
// error lists the registered ones, and the lists are complete even to a reader running in a
// static initialiser, before main.
#include "registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device_backends.h"
#include "disk_io_backends.h"
#include "eviction_policies.h"
#include "kvoffload/config.h"
#include "kvoffload/device.h"
#include "kvoffload/disk_io.h"
#include "kvoffload/eviction_policy.h"

namespace kvoffload {
namespace {

using Names = std::vector<std::string>;

// Read during static initialisation of this test's objects, which may run before or after the
// library's: the registry must already hold every built-in either way.
const Names kPoliciesSeenBeforeMain = EvictionPolicyNames();
const Names kDevicesSeenBeforeMain = DeviceBackendNames();
const Names kDiskIoSeenBeforeMain = DiskIoNames();

TEST(RegistryTest, EachListsExactlyItsBuiltIns) {
  EXPECT_EQ(EvictionPolicyNames(), (Names{"arc", "chain-lru", "lirs", "lru", "lru-tinylfu", "s3fifo"}));
  EXPECT_EQ(DeviceBackendNames(), (Names{"cuda", "host"}));
  EXPECT_EQ(DiskIoNames(), (Names{"auto", "psync", "uring"}));
}

TEST(RegistryTest, CompleteWhenReadBeforeMain) {
  EXPECT_EQ(kPoliciesSeenBeforeMain, EvictionPolicyNames());
  EXPECT_EQ(kDevicesSeenBeforeMain, DeviceBackendNames());
  EXPECT_EQ(kDiskIoSeenBeforeMain, DiskIoNames());
}

void ExpectUnknown(const Status& s, const std::string& value, const std::string& names) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("\"" + value + "\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("use one of: " + names), std::string::npos) << s.message();
}

TEST(RegistryTest, UnknownNameErrorListsTheRegisteredNames) {
  ExpectUnknown(NewEvictionPolicy("fifo", 4).status(), "fifo",
                "arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo");
  ExpectUnknown(NewDeviceBackend("tpu").status(), "tpu", "cuda, host");
  ExpectUnknown(NewDiskIo("aio", DiskIoOptions{}).status(), "aio", "auto, psync, uring");
}

// The configuration checks its names against the same registries, naming the field.
TEST(RegistryTest, ConfigNamesTheFieldTheValueAndTheRegisteredNames) {
  EngineConfig c;
  c.block_bytes = 4096;
  c.cpu_bytes = 4 * 4096;
  c.fingerprint.model = "m";
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  EngineConfig bad = c;
  bad.device = "tpu";
  ExpectUnknown(bad.Validate(), "tpu", "cuda, host");
  EXPECT_EQ(bad.Validate().message().rfind("device=", 0), 0u) << bad.Validate().message();
  bad = c;
  bad.disk_io = "aio";
  ExpectUnknown(bad.Validate(), "aio", "auto, psync, uring");
  bad = c;
  bad.eviction_policy = "fifo";
  ExpectUnknown(bad.Validate(), "fifo", "arc, chain-lru, lirs, lru, lru-tinylfu, s3fifo");
}

// The template itself, on a registry of its own.
struct Widget {
  explicit Widget(int v) : value(v) {}
  virtual ~Widget() = default;
  int value;
};
using WidgetRegistry = Registry<Widget, int>;

TEST(RegistryTest, NamesAreUniqueValidAndSorted) {
  WidgetRegistry r("widget");
  auto make = [](int v) -> Result<std::unique_ptr<Widget>> { return std::make_unique<Widget>(v); };
  EXPECT_TRUE(r.Register("zeta", make));
  EXPECT_TRUE(r.Register("alpha-2", make));
  EXPECT_FALSE(r.Register("zeta", make)) << "a name registers once";
  for (const char* bad : {"", "Alpha", "a,b", "a b", "a_b"}) {
    EXPECT_FALSE(r.Register(bad, make)) << "\"" << bad << "\"";
  }
  EXPECT_FALSE(r.Register("empty", WidgetRegistry::Factory()));
  EXPECT_EQ(r.Names(), (Names{"alpha-2", "zeta"}));
  EXPECT_TRUE(r.Contains("zeta"));
  EXPECT_FALSE(r.Contains("beta"));
}

TEST(RegistryTest, CreatePassesItsArgumentsAndReportsUnknownNames) {
  WidgetRegistry r("widget");
  ASSERT_TRUE(r.Register("double", [](int v) -> Result<std::unique_ptr<Widget>> {
    return std::make_unique<Widget>(2 * v);
  }));
  ASSERT_TRUE(r.Register("refuse", [](int) -> Result<std::unique_ptr<Widget>> {
    return Status::Unavailable("not here");
  }));
  Result<std::unique_ptr<Widget>> w = r.Create("double", 21);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->value, 42);
  EXPECT_EQ(r.Create("refuse", 1).status().code(), StatusCode::kUnavailable);
  const Status unknown = r.Create("triple", 1).status();
  EXPECT_EQ(unknown.message(), "widget \"triple\" is not known; use one of: double, refuse");
  EXPECT_EQ(r.Unknown("triple", "WIDGET").message(),
            "WIDGET=\"triple\" is not a known widget; use one of: double, refuse");
}

}  // namespace
}  // namespace kvoffload
