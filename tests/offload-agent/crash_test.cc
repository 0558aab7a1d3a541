// Crash safety: a writer killed with SIGKILL at random moments, then a restart on the
// same directory, never serves a wrong block; two processes hammering one shared tier never
// read a torn block. The default sizes keep `make test` short; `make reliability` runs the
// full sizes through KVO_CRASH_TRIALS (100) and KVO_HAMMER_SECONDS (60) and records the
// figures printed here.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace kvoffload {
namespace {

using testing::Reap;
using testing::TempDir;

struct Outcome {
  uint64_t exact = 0, wrong = 0, missed = 0, recovery_us = 0;
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

pid_t SpawnHelper(const std::vector<std::string>& args) {
  std::vector<std::string> all{KVOFFLOAD_CRASH_HELPER};
  all.insert(all.end(), args.begin(), args.end());
  return testing::Spawn(all);
}

Outcome ReadOutcome(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  Outcome o;
  EXPECT_EQ(std::sscanf(text.c_str(), "exact=%lu wrong=%lu missed=%lu recovery_us=%lu", &o.exact,
                        &o.wrong, &o.missed, &o.recovery_us),
            4)
      << path << ": " << text;
  return o;
}

TEST(CrashTest, KilledWriterThenRestartServesNoWrongBlock) {
  const int trials = EnvInt("KVO_CRASH_TRIALS", 5);
  TempDir dir;
  const std::string tier = dir.path() + "/tier";
  std::filesystem::create_directory(tier);  // the volume the replicas mount
  std::mt19937 rng(20261129);
  uint64_t exact = 0, wrong = 0, missed = 0;
  std::vector<uint64_t> recovery_us;
  for (int t = 0; t < trials; ++t) {
    SCOPED_TRACE("trial " + std::to_string(t));
    std::filesystem::remove(tier + "/.ready");
    const pid_t writer = SpawnHelper({"write", tier});
    for (int i = 0; i < 3000 && !std::filesystem::exists(tier + "/.ready"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // A random moment: anywhere in a write, a rename, an eviction or a ledger update.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300000));
    ASSERT_EQ(::kill(writer, SIGKILL), 0);
    ASSERT_EQ(Reap(writer), 128 + SIGKILL) << "the writer stopped before it was killed";
    // The same directory survives every trial: leftovers of all earlier crashes pile up.
    const std::string result = dir.path() + "/verify.result";
    ASSERT_EQ(Reap(SpawnHelper({"verify", tier, result})), 0);
    const Outcome o = ReadOutcome(result);
    exact += o.exact;
    wrong += o.wrong;
    missed += o.missed;
    recovery_us.push_back(o.recovery_us);
  }
  std::sort(recovery_us.begin(), recovery_us.end());
  std::printf("crash trials=%d wrong=%lu exact=%lu missed=%lu recovery_us median=%lu max=%lu\n",
              trials, wrong, exact, missed, recovery_us[recovery_us.size() / 2],
              recovery_us.back());
  EXPECT_EQ(wrong, 0u);
  // Each restart recovered blocks from the killed run: the persistent tier did its job.
  EXPECT_GT(exact, 0u);
}

TEST(CrashTest, TwoProcessesHammeringOneSharedTierNeverReadTornBlocks) {
  const int seconds = EnvInt("KVO_HAMMER_SECONDS", 3);
  TempDir dir;
  const std::string tier = dir.path() + "/tier";
  std::filesystem::create_directory(tier);  // the volume the replicas mount
  const pid_t a = SpawnHelper({"hammer", tier, std::to_string(seconds), "1", dir.path() + "/a.result"});
  const pid_t b = SpawnHelper({"hammer", tier, std::to_string(seconds), "2", dir.path() + "/b.result"});
  ASSERT_EQ(Reap(a), 0);
  ASSERT_EQ(Reap(b), 0);
  const Outcome oa = ReadOutcome(dir.path() + "/a.result");
  const Outcome ob = ReadOutcome(dir.path() + "/b.result");
  std::printf("shared-tier hammer seconds=%d loads_exact=%lu wrong=%lu missed=%lu\n", seconds,
              oa.exact + ob.exact, oa.wrong + ob.wrong, oa.missed + ob.missed);
  EXPECT_EQ(oa.wrong + ob.wrong, 0u);
  EXPECT_GT(oa.exact + ob.exact, 0u) << "the processes must actually have loaded blocks";
}

}  // namespace
}  // namespace kvoffload
