// A thread that cannot be started (a container at its pids limit; vLLM starts many) while a
// pool starts its workers: the pool's constructor threw with threads already running, and
// destroying their std::thread objects called std::terminate, so kvo_engine_create aborted
// the serving process instead of returning an error. tests/common/thread_limit.c makes
// pthread_create fail after a given number of threads.
#include <gtest/gtest.h>

#include <string>
#include <system_error>

#include "kvoffload/c.h"
#include "kvoffload/work_queue.h"

extern "C" int kvo_test_threads_left;

namespace kvoffload {
namespace {

class ThreadFailureTest : public ::testing::Test {
 protected:
  void TearDown() override { kvo_test_threads_left = -1; }
};

TEST_F(ThreadFailureTest, APoolThatCannotStartAllItsThreadsThrows) {
  kvo_test_threads_left = 1;
  EXPECT_THROW(WorkQueue(3, WorkQueue::OnStop::kRunQueued), std::system_error);
  kvo_test_threads_left = -1;
  WorkQueue q(3, WorkQueue::OnStop::kRunQueued);  // and the next one starts
  EXPECT_EQ(q.threads(), 3u);
}

TEST_F(ThreadFailureTest, AnEngineThatCannotStartItsThreadsIsAnError) {
  for (int allowed : {1, 2, 3}) {
    kvo_options o{};
    o.struct_size = sizeof(o);
    o.block_bytes = 4096;
    o.model = "m";
    o.cpu_bytes = 1 << 20;
    kvo_engine* e = nullptr;
    kvo_test_threads_left = allowed;
    const kvo_status status = kvo_engine_create(&o, &e);
    kvo_test_threads_left = -1;
    EXPECT_NE(status, KVO_OK) << allowed;
    EXPECT_EQ(e, nullptr);
    EXPECT_NE(std::string(kvo_last_error()).find("thread"), std::string::npos)
        << kvo_last_error();
  }
}

}  // namespace
}  // namespace kvoffload
