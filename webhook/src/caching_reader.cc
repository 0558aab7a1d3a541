#include "webhook/caching_reader.h"

#include "kvoffload/work_queue.h"

namespace kvoffload::webhook {

CachingClusterReader::CachingClusterReader(ClusterReader* inner, Clock::duration ttl,
                                           Clock::duration stale_ttl, Metrics* metrics)
    : inner_(inner), ttl_(ttl), stale_ttl_(stale_ttl), metrics_(metrics) {}

void CachingClusterReader::Record(ObjectKind kind, LookupResult result) {
  if (metrics_ != nullptr) metrics_->RecordLookup(kind, result);
}

CachingClusterReader::Answer CachingClusterReader::GetBefore(const ObjectRef& ref,
                                                            Deadline deadline) {
  std::promise<Answer> promise;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Entry& e = entries_[ref];
    const Clock::time_point now = Clock::now();
    if (e.last_good && now - e.fetched_at < ttl_) {
      Record(ref.kind, LookupResult::kHit);
      return *e.last_good;
    }
    if (e.inflight.valid()) {
      // Someone is already asking: wait for that answer instead of asking again.
      std::shared_future<Answer> shared = e.inflight;
      lock.unlock();
      const bool answered = [&] {
        const WorkQueue::Blocking waiting;  // another admission may run meanwhile
        // Deadline::max() would overflow inside wait_until's clock arithmetic.
        if (deadline == Deadline::max()) {
          shared.wait();
          return true;
        }
        return shared.wait_until(deadline) == std::future_status::ready;
      }();
      if (answered) {
        Record(ref.kind, LookupResult::kHit);
        return shared.get();
      }
      lock.lock();
      Entry& waited = entries_[ref];
      if (waited.last_good && Clock::now() - waited.fetched_at < stale_ttl_) {
        Record(ref.kind, LookupResult::kStale);
        return *waited.last_good;
      }
      Record(ref.kind, LookupResult::kError);
      return Status::Unavailable("the API server has not answered for " + ref.ToString() +
                                 " within the lookup budget (--lookup-timeout)");
    }
    e.inflight = promise.get_future().share();
  }

  Answer answer = [&] {
    const WorkQueue::Blocking waiting;  // on the API server: another admission may run meanwhile
    return inner_->GetBefore(ref, deadline);
  }();
  Answer result = answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[ref];
    if (answer.ok()) {
      // Only objects that exist are kept: a PVC created right after a denial must be seen by
      // the retry, not hidden behind a cached "not found" for the TTL.
      if (answer->has_value()) {
        e.last_good = answer;
        e.fetched_at = Clock::now();
      }
      Record(ref.kind, LookupResult::kMiss);
    } else if (e.last_good && Clock::now() - e.fetched_at < stale_ttl_ &&
               answer.status().code() != StatusCode::kFailedPrecondition) {
      // The API server failed; a recent answer beats a denial. Not where it refused to
      // answer (403): that is the answer, and an old copy would hide a broken RBAC for the
      // stale TTL.
      result = *e.last_good;
      Record(ref.kind, LookupResult::kStale);
    } else {
      Record(ref.kind, LookupResult::kError);
    }
    e.inflight = {};
  }
  promise.set_value(result);
  return result;
}

}  // namespace kvoffload::webhook
