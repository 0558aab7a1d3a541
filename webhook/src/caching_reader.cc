#include "webhook/caching_reader.h"

#include <algorithm>

#include "kvoffload/work_queue.h"

namespace kvoffload::webhook {

CachingClusterReader::CachingClusterReader(ClusterReader* inner, Clock::duration ttl,
                                           Clock::duration stale_ttl, Metrics* metrics)
    : inner_(inner), ttl_(ttl), stale_ttl_(stale_ttl), metrics_(metrics) {}

void CachingClusterReader::Record(ObjectKind kind, LookupResult result) {
  if (metrics_ != nullptr) metrics_->RecordLookup(kind, result);
}

size_t CachingClusterReader::entries() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void CachingClusterReader::SweepLocked(Clock::time_point now) {
  std::erase_if(entries_, [&](const auto& item) {
    const Entry& e = item.second;
    return !e.inflight.valid() && (!e.last_good || now - e.fetched_at >= stale_ttl_);
  });
  sweep_at_ = std::max<size_t>(1024, 2 * entries_.size());
}

CachingClusterReader::Answer CachingClusterReader::GetBefore(const ObjectRef& ref,
                                                            Deadline deadline) {
  std::promise<Shared> promise;
  bool asked_again = false;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    Entry& e = entries_[ref];
    const Clock::time_point now = Clock::now();
    if (e.last_good && now - e.fetched_at < ttl_) {
      Record(ref.kind, LookupResult::kHit);
      return *e.last_good;
    }
    if (!e.inflight.valid()) {
      e.inflight = promise.get_future().share();
      e.inflight_deadline = deadline;
      if (entries_.size() >= sweep_at_) SweepLocked(now);
      break;
    }
    // Someone is already asking: wait for that answer instead of asking again.
    std::shared_future<Shared> shared = e.inflight;
    const Deadline theirs = e.inflight_deadline;
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
      const Shared& got = shared.get();
      // That call ran out of its own time (or reached no API server) with this one's left:
      // its error is not this admission's, which asks once itself (an admission with 50 ms
      // left handed its "budget spent" to those waiting with seconds).
      if (got.result == LookupResult::kError &&
          got.answer.status().code() == StatusCode::kUnavailable && !asked_again &&
          deadline > theirs && Clock::now() < deadline) {
        asked_again = true;
        continue;
      }
      // The call's own GET is its miss; a waiter cost none, so a fresh answer is a hit for
      // it, but a stale copy or an error is what it got and is counted as such.
      Record(ref.kind, got.result == LookupResult::kMiss ? LookupResult::kHit : got.result);
      return got.answer;
    }
    lock.lock();
    const auto waited = entries_.find(ref);
    if (waited != entries_.end() && waited->second.last_good &&
        Clock::now() - waited->second.fetched_at < stale_ttl_) {
      Record(ref.kind, LookupResult::kStale);
      return *waited->second.last_good;
    }
    Record(ref.kind, LookupResult::kError);
    return Status::Unavailable("the API server has not answered for " + ref.ToString() +
                               " within the lookup budget (--lookup-timeout)");
  }

  Shared shared{[&] {
                  // On the API server: another admission may run meanwhile.
                  const WorkQueue::Blocking waiting;
                  return inner_->GetBefore(ref, deadline);
                }(),
                LookupResult::kMiss};
  const Answer& answer = shared.answer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[ref];
    if (answer.ok()) {
      // Only objects that exist are kept: a PVC created right after a denial must be seen by
      // the retry, not hidden behind a cached "not found" for the TTL.
      if (answer->has_value()) {
        e.last_good = answer;
        e.fetched_at = Clock::now();
      } else {
        // Gone: an older copy must not stand in for it when the API server next fails (a
        // deleted PVC would be admitted and the pod fail to mount).
        e.last_good.reset();
      }
    } else if (e.last_good && Clock::now() - e.fetched_at < stale_ttl_ &&
               answer.status().code() != StatusCode::kFailedPrecondition) {
      // The API server failed; a recent answer beats a denial. Not where it refused to
      // answer (401, 403, the other 4xx but 429: FailedPrecondition, api_status.h): that is
      // the answer, and an old copy would hide a revoked token or a broken RBAC for the stale
      // TTL.
      shared = Shared{*e.last_good, LookupResult::kStale};
    } else {
      shared.result = LookupResult::kError;
    }
    Record(ref.kind, shared.result);
    e.inflight = {};
    // Nothing left to serve from it (not found, or an error with no copy): forgotten, so that
    // names that do not exist cost no memory. Waiters hold the answer itself.
    if (!e.last_good) entries_.erase(ref);
  }
  promise.set_value(shared);
  return std::move(shared.answer);
}

}  // namespace kvoffload::webhook
