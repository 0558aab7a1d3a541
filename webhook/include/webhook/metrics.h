// Prometheus counters and the admission latency histograms, rendered in the text exposition
// format on the metrics port. Every labelled series exists from the start at 0, so rate() and
// absent-series alerts work before the first event. Lock-free (atomics); thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_METRICS_H_
#define KVOFFLOAD_WEBHOOK_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "webhook/cluster_reader.h"

namespace kvoffload::webhook {

// What one admission request ended as.
enum class Outcome { kInjected, kUnchanged, kSkipped, kDenied, kError, kCount };
const char* OutcomeName(Outcome outcome);

// What one validation request (an apply-time check) ended as.
enum class Verdict { kAllowed, kWarned, kDenied, kSkipped, kError, kCount };
const char* VerdictName(Verdict verdict);

// Why a pod admission left the pod as it was (label `reason` of kvoffload_injection_skip_total).
// The namespace and object selectors skip pods before the webhook sees them: not counted here.
enum class SkipReason {
  kNotCreate,        // an operation other than CREATE (the webhook's rules send only CREATE)
  kOptedOut,         // label kvoffload.io/inject=false
  kNoSpec,           // no kvCacheOffloading spec: annotation, LLMInferenceService, namespace
  kAlreadyInjected,  // its kvoffload.io/status carries the resolved config hash (reinvocation)
  kCount
};
const char* SkipReasonName(SkipReason reason);

// Why a pod admission failed (label `type` of kvoffload_injection_failure_total).
enum class FailureType {
  kBadRequest,   // not a readable AdmissionReview of a Pod: content type, size, JSON, kind, uid
  kInvalidSpec,  // the resolved kvCacheOffloading spec fails validation (denied)
  kRejected,     // a valid spec that does not fit the pod or cluster: memory or ephemeral-storage
                 // limit, container, mode annotation, missing pvc.ref PVC (denied)
  kLookup,       // reading the LLMInferenceService, Namespace or PVC failed (error)
  kInternal,     // an exception escaped the handler; a bug
  kCount
};
const char* FailureTypeName(FailureType type);

// One pod admission as the metrics count it. Built only through the named constructors, so a
// skip always carries its reason, a failure its type, and the outcome follows from them.
class AdmissionResult {
 public:
  static AdmissionResult Injected() { return AdmissionResult(Outcome::kInjected, 0); }
  // kAlreadyInjected is the outcome "unchanged", the other reasons "skipped".
  static AdmissionResult Skipped(SkipReason reason);
  // kInvalidSpec and kRejected are denials, the other types errors.
  static AdmissionResult Failed(FailureType type);

  Outcome outcome() const { return outcome_; }
  bool skipped() const { return outcome_ == Outcome::kSkipped || outcome_ == Outcome::kUnchanged; }
  bool failed() const { return outcome_ == Outcome::kDenied || outcome_ == Outcome::kError; }
  // REQUIRES: skipped().
  SkipReason skip_reason() const { return static_cast<SkipReason>(detail_); }
  // REQUIRES: failed().
  FailureType failure_type() const { return static_cast<FailureType>(detail_); }
  // The reason or type name for logs; "" for an injection.
  const char* DetailName() const;

 private:
  AdmissionResult(Outcome outcome, size_t detail) : outcome_(outcome), detail_(detail) {}
  Outcome outcome_;
  size_t detail_;  // a SkipReason or a FailureType, by outcome
};

enum class LookupResult { kHit, kMiss, kStale, kError, kCount };

class Metrics {
 public:
  void RecordAdmission(const AdmissionResult& result, double seconds);
  void RecordValidation(Verdict verdict);
  uint64_t validations(Verdict verdict) const {
    return validations_[static_cast<size_t>(verdict)].load(std::memory_order_relaxed);
  }
  void RecordLookup(ObjectKind kind, LookupResult result);
  // A request to the admission port for no route (404) or with another method (405).
  void RecordUnrouted(bool wrong_method) { ++unrouted_[wrong_method ? 1 : 0]; }
  uint64_t unrouted(bool wrong_method) const { return unrouted_[wrong_method ? 1 : 0].load(); }
  // `not_after`: the loaded certificate's expiry (Unix seconds), read only when `ok`.
  void RecordCertReload(bool ok, int64_t not_after);
  uint64_t admissions(Outcome outcome) const;
  uint64_t skips(SkipReason reason) const {
    return skips_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }
  uint64_t failures(FailureType type) const {
    return failures_[static_cast<size_t>(type)].load(std::memory_order_relaxed);
  }
  uint64_t lookups(ObjectKind kind, LookupResult result) const;
  uint64_t cert_reloads(bool ok) const { return (ok ? cert_reloads_ok_ : cert_reloads_failed_).load(); }
  int64_t cert_not_after() const { return cert_not_after_.load(); }
  std::string Render() const;

 private:
  static constexpr std::array<double, 13> kBuckets{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                   0.1,    0.25,  0.5,    1,     2.5,   5};
  static constexpr size_t kOutcomes = static_cast<size_t>(Outcome::kCount);
  static constexpr size_t kLookupResults = static_cast<size_t>(LookupResult::kCount);
  // One latency histogram per outcome; rendered with an `outcome` label, so `sum by (le)`
  // still gives the histogram of every admission.
  struct Histogram {
    std::array<std::atomic<uint64_t>, kBuckets.size()> buckets{};  // non-cumulative
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum_ns{0};
  };
  std::array<std::atomic<uint64_t>, kOutcomes> admissions_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(SkipReason::kCount)> skips_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(FailureType::kCount)> failures_{};
  // Counted apart from admissions: the pod counters must not move when objects are applied.
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Verdict::kCount)> validations_{};
  std::array<Histogram, kOutcomes> latency_{};
  std::array<std::array<std::atomic<uint64_t>, kLookupResults>, kObjectKinds> lookups_{};
  std::array<std::atomic<uint64_t>, 2> unrouted_{};  // 404, 405
  std::atomic<uint64_t> cert_reloads_ok_{0};
  std::atomic<uint64_t> cert_reloads_failed_{0};
  std::atomic<int64_t> cert_not_after_{0};  // the served certificate's; 0 before the first
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_METRICS_H_
