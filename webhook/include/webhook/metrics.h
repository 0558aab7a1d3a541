// Prometheus counters and the admission latency histogram, rendered in the text exposition
// format on the metrics port. Lock-free (atomics); thread-safe.
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

enum class LookupResult { kHit, kMiss, kStale, kError, kCount };

class Metrics {
 public:
  void RecordAdmission(Outcome outcome, double seconds);
  void RecordValidation(Verdict verdict);
  uint64_t validations(Verdict verdict) const {
    return validations_[static_cast<size_t>(verdict)].load(std::memory_order_relaxed);
  }
  void RecordLookup(ObjectKind kind, LookupResult result);
  void RecordCertReload(bool ok);
  uint64_t admissions(Outcome outcome) const;
  uint64_t lookups(ObjectKind kind, LookupResult result) const;
  uint64_t cert_reloads(bool ok) const { return (ok ? cert_reloads_ok_ : cert_reloads_failed_).load(); }
  std::string Render() const;

 private:
  static constexpr std::array<double, 13> kBuckets{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                   0.1,    0.25,  0.5,    1,     2.5,   5};
  static constexpr size_t kOutcomes = static_cast<size_t>(Outcome::kCount);
  static constexpr size_t kLookupResults = static_cast<size_t>(LookupResult::kCount);
  std::array<std::atomic<uint64_t>, kOutcomes> admissions_{};
  // Counted apart from admissions: the pod counters must not move when objects are applied.
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Verdict::kCount)> validations_{};
  std::array<std::atomic<uint64_t>, kBuckets.size()> latency_buckets_{};  // non-cumulative
  std::atomic<uint64_t> latency_count_{0};
  std::atomic<uint64_t> latency_sum_ns_{0};
  std::array<std::array<std::atomic<uint64_t>, kLookupResults>, 3> lookups_{};
  std::atomic<uint64_t> cert_reloads_ok_{0};
  std::atomic<uint64_t> cert_reloads_failed_{0};
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_METRICS_H_
