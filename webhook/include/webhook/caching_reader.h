// A ClusterReader decorator: answers are kept `ttl` so a ReplicaSet of N pods costs one lookup,
// concurrent misses for the same object share one call (single flight), and when the API
// server fails a previous answer up to `stale_ttl` old is served instead. Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_CACHING_READER_H_
#define KVOFFLOAD_WEBHOOK_CACHING_READER_H_

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>

#include "webhook/cluster_reader.h"
#include "webhook/metrics.h"

namespace kvoffload::webhook {

class CachingClusterReader final : public ClusterReader {
 public:
  using Clock = std::chrono::steady_clock;
  // `inner` and `metrics` are not owned and must outlive this object; metrics may be null.
  CachingClusterReader(ClusterReader* inner, Clock::duration ttl, Clock::duration stale_ttl,
                       Metrics* metrics);
  // A caller that finds another's call for the same object in flight waits for it only until
  // its own deadline; then it gets the last good answer if one is recent enough, else an error.
  // Where that call ran out of time or reached no API server and the waiter has more time than
  // it had, the waiter asks once itself.
  Result<std::optional<nlohmann::json>> GetBefore(const ObjectRef& ref,
                                                  Deadline deadline) override;
  bool Authoritative() const override { return inner_->Authoritative(); }
  // Objects remembered: those with an answer that may still be served, and calls in flight.
  size_t entries();

 private:
  using Answer = Result<std::optional<nlohmann::json>>;
  // What a call in flight hands its waiters: the answer, and how the caller that made the call
  // got it (a fresh read, a stale copy, an error), so that each waiter counts what it received.
  struct Shared {
    Answer answer;
    LookupResult result;
  };
  struct Entry {
    std::shared_future<Shared> inflight;  // valid while a call is running
    Deadline inflight_deadline;           // that call's
    std::optional<Answer> last_good;      // the last successful answer
    Clock::time_point fetched_at;
  };
  // Forgets the entries that can serve nothing any more (no call in flight, no answer younger
  // than stale_ttl): every name ever asked about stayed, and a loop of dry-run pods naming a
  // new object each time grew the webhook without bound. Run when the map has doubled since.
  void SweepLocked(Clock::time_point now);
  void Record(ObjectKind kind, LookupResult result);

  ClusterReader* const inner_;
  const Clock::duration ttl_;
  const Clock::duration stale_ttl_;
  Metrics* const metrics_;
  std::mutex mu_;
  std::map<ObjectRef, Entry> entries_;  // GUARDED_BY(mu_)
  size_t sweep_at_ = 1024;               // GUARDED_BY(mu_): the size that sweeps next
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_CACHING_READER_H_
