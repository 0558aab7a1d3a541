// Runs a test's code on a thread allowed only one CPU (the first of the caller's affinity mask),
// as in a container given a one-CPU cpuset: threads inherit their creator's mask, and code that
// sizes its threads by UsableCpus reads its own. Shared by the webhook's and the agent's tests.
#ifndef KVOFFLOAD_TESTS_COMMON_ON_ONE_CPU_H_
#define KVOFFLOAD_TESTS_COMMON_ON_ONE_CPU_H_

#include <gtest/gtest.h>
#include <sched.h>

#include <functional>
#include <thread>

namespace kvoffload::testing {

inline void OnOneCpu(const std::function<void()>& body) {
  cpu_set_t all;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(all), &all), 0);
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (size_t cpu = 0; cpu < size_t{CPU_SETSIZE}; ++cpu) {
      if (CPU_ISSET(cpu, &all)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
    body();
  }).join();
}

}  // namespace kvoffload::testing

#endif  // KVOFFLOAD_TESTS_COMMON_ON_ONE_CPU_H_
