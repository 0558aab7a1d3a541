#include "webhook/metrics.h"

#include <algorithm>
#include <cstdio>

namespace kvoffload::webhook {
namespace {

const char* LookupResultName(LookupResult r) {
  switch (r) {
    case LookupResult::kHit: return "hit";
    case LookupResult::kMiss: return "miss";
    case LookupResult::kStale: return "stale";
    case LookupResult::kError: return "error";
    case LookupResult::kCount: break;
  }
  return "unknown";
}

std::string FormatDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Nanoseconds as seconds, every digit kept: %g's six significant digits left a sum past 29.8745 s
// unmoved by admissions of microseconds, and rate(_sum)/rate(_count) went flat.
std::string FormatNanosAsSeconds(uint64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%llu.%09llu", static_cast<unsigned long long>(ns / 1000000000),
                static_cast<unsigned long long>(ns % 1000000000));
  return buf;
}

}  // namespace

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kInjected: return "injected";
    case Outcome::kUnchanged: return "unchanged";
    case Outcome::kSkipped: return "skipped";
    case Outcome::kDenied: return "denied";
    case Outcome::kError: return "error";
    case Outcome::kCount: break;
  }
  return "unknown";
}

const char* SkipReasonName(SkipReason reason) {
  switch (reason) {
    case SkipReason::kNotCreate: return "not_create";
    case SkipReason::kOptedOut: return "opted_out";
    case SkipReason::kNoSpec: return "no_spec";
    case SkipReason::kAlreadyInjected: return "already_injected";
    case SkipReason::kCount: break;
  }
  return "unknown";
}

const char* FailureTypeName(FailureType type) {
  switch (type) {
    case FailureType::kBadRequest: return "bad_request";
    case FailureType::kInvalidSpec: return "invalid_spec";
    case FailureType::kRejected: return "rejected";
    case FailureType::kLookup: return "lookup";
    case FailureType::kInternal: return "internal";
    case FailureType::kCount: break;
  }
  return "unknown";
}

AdmissionResult AdmissionResult::Skipped(SkipReason reason) {
  return AdmissionResult(
      reason == SkipReason::kAlreadyInjected ? Outcome::kUnchanged : Outcome::kSkipped,
      static_cast<size_t>(reason));
}

AdmissionResult AdmissionResult::Failed(FailureType type) {
  const bool denial = type == FailureType::kInvalidSpec || type == FailureType::kRejected;
  return AdmissionResult(denial ? Outcome::kDenied : Outcome::kError, static_cast<size_t>(type));
}

const char* AdmissionResult::DetailName() const {
  if (skipped()) return SkipReasonName(skip_reason());
  if (failed()) return FailureTypeName(failure_type());
  return "";
}

const char* VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kAllowed: return "allowed";
    case Verdict::kWarned: return "warned";
    case Verdict::kDenied: return "denied";
    case Verdict::kSkipped: return "skipped";
    case Verdict::kError: return "error";
    case Verdict::kCount: break;
  }
  return "unknown";
}

void Metrics::RecordValidation(Verdict verdict) {
  validations_[static_cast<size_t>(verdict)].fetch_add(1, std::memory_order_relaxed);
}

void Metrics::RecordAdmission(const AdmissionResult& result, double seconds) {
  const size_t outcome = static_cast<size_t>(result.outcome());
  admissions_[outcome].fetch_add(1, std::memory_order_relaxed);
  if (result.skipped()) {
    skips_[static_cast<size_t>(result.skip_reason())].fetch_add(1, std::memory_order_relaxed);
  } else if (result.failed()) {
    failures_[static_cast<size_t>(result.failure_type())].fetch_add(1, std::memory_order_relaxed);
  }
  Histogram& h = latency_[outcome];
  size_t bucket = 0;
  while (bucket < kBuckets.size() && seconds > kBuckets[bucket]) ++bucket;
  if (bucket < kBuckets.size()) h.buckets[bucket].fetch_add(1, std::memory_order_relaxed);
  h.count.fetch_add(1, std::memory_order_relaxed);
  h.sum_ns.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void Metrics::RecordLookup(ObjectKind kind, LookupResult result) {
  lookups_[static_cast<size_t>(kind)][static_cast<size_t>(result)].fetch_add(
      1, std::memory_order_relaxed);
}

void Metrics::RecordCertReload(bool ok, int64_t not_after) {
  (ok ? cert_reloads_ok_ : cert_reloads_failed_).fetch_add(1, std::memory_order_relaxed);
  if (ok) cert_not_after_.store(not_after, std::memory_order_relaxed);
}

uint64_t Metrics::admissions(Outcome outcome) const {
  return admissions_[static_cast<size_t>(outcome)].load(std::memory_order_relaxed);
}

uint64_t Metrics::lookups(ObjectKind kind, LookupResult result) const {
  return lookups_[static_cast<size_t>(kind)][static_cast<size_t>(result)].load(
      std::memory_order_relaxed);
}

std::string Metrics::Render() const {
  std::string out;
  out += "# HELP kvoffload_admission_requests_total Admission requests by outcome.\n";
  out += "# TYPE kvoffload_admission_requests_total counter\n";
  for (size_t i = 0; i < kOutcomes; ++i) {
    out += std::string("kvoffload_admission_requests_total{outcome=\"") +
           OutcomeName(static_cast<Outcome>(i)) + "\"} " + std::to_string(admissions_[i].load()) +
           "\n";
  }
  // The injector's view of the same admissions, in the shape of Istio's sidecar injector:
  // requests = success + skip + failure.
  uint64_t requests = 0;
  for (const std::atomic<uint64_t>& a : admissions_) requests += a.load();
  out += "# HELP kvoffload_injection_requests_total Pod admission requests.\n";
  out += "# TYPE kvoffload_injection_requests_total counter\n";
  out += "kvoffload_injection_requests_total " + std::to_string(requests) + "\n";
  out += "# HELP kvoffload_injection_success_total Pods patched with the offloading tiers.\n";
  out += "# TYPE kvoffload_injection_success_total counter\n";
  out += "kvoffload_injection_success_total " + std::to_string(admissions(Outcome::kInjected)) +
         "\n";
  out += "# HELP kvoffload_injection_skip_total Pods admitted unchanged, by reason.\n";
  out += "# TYPE kvoffload_injection_skip_total counter\n";
  for (size_t i = 0; i < skips_.size(); ++i) {
    out += std::string("kvoffload_injection_skip_total{reason=\"") +
           SkipReasonName(static_cast<SkipReason>(i)) + "\"} " + std::to_string(skips_[i].load()) +
           "\n";
  }
  out += "# HELP kvoffload_injection_failure_total Pod admissions denied or failed, by type.\n";
  out += "# TYPE kvoffload_injection_failure_total counter\n";
  for (size_t i = 0; i < failures_.size(); ++i) {
    out += std::string("kvoffload_injection_failure_total{type=\"") +
           FailureTypeName(static_cast<FailureType>(i)) + "\"} " +
           std::to_string(failures_[i].load()) + "\n";
  }
  out += "# HELP kvoffload_validation_requests_total Apply-time validation requests by verdict.\n";
  out += "# TYPE kvoffload_validation_requests_total counter\n";
  for (size_t i = 0; i < validations_.size(); ++i) {
    out += std::string("kvoffload_validation_requests_total{verdict=\"") +
           VerdictName(static_cast<Verdict>(i)) + "\"} " + std::to_string(validations_[i].load()) +
           "\n";
  }
  out += "# HELP kvoffload_admission_duration_seconds Time to answer a pod admission request, by "
         "outcome.\n";
  out += "# TYPE kvoffload_admission_duration_seconds histogram\n";
  for (size_t o = 0; o < kOutcomes; ++o) {
    const Histogram& h = latency_[o];
    const std::string outcome =
        std::string("outcome=\"") + OutcomeName(static_cast<Outcome>(o)) + "\"";
    // The count is read first and the buckets clamped to it: an admission recorded meanwhile
    // never makes a finite bucket exceed +Inf.
    const uint64_t count = h.count.load();
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      cumulative += h.buckets[i].load();
      out += "kvoffload_admission_duration_seconds_bucket{" + outcome + ",le=\"" +
             FormatDouble(kBuckets[i]) + "\"} " + std::to_string(std::min(cumulative, count)) +
             "\n";
    }
    out += "kvoffload_admission_duration_seconds_bucket{" + outcome + ",le=\"+Inf\"} " +
           std::to_string(count) + "\n";
    out += "kvoffload_admission_duration_seconds_sum{" + outcome + "} " +
           FormatNanosAsSeconds(h.sum_ns.load()) + "\n";
    out += "kvoffload_admission_duration_seconds_count{" + outcome + "} " +
           std::to_string(count) + "\n";
  }
  out += "# HELP kvoffload_lookups_total Cluster object lookups by kind and result.\n";
  out += "# TYPE kvoffload_lookups_total counter\n";
  for (size_t k = 0; k < lookups_.size(); ++k) {
    for (size_t r = 0; r < kLookupResults; ++r) {
      out += std::string("kvoffload_lookups_total{kind=\"") +
             ObjectKindName(static_cast<ObjectKind>(k)) + "\",result=\"" +
             LookupResultName(static_cast<LookupResult>(r)) + "\"} " +
             std::to_string(lookups_[k][r].load()) + "\n";
    }
  }
  // A webhook configuration with a wrong path sends every pod here, and with failurePolicy Fail
  // none is created: no admission is counted, so only this shows it.
  out += "# HELP kvoffload_unrouted_requests_total Requests to the admission port for no route "
         "(404) or with another method (405).\n";
  out += "# TYPE kvoffload_unrouted_requests_total counter\n";
  out += "kvoffload_unrouted_requests_total{status=\"404\"} " + std::to_string(unrouted_[0].load()) +
         "\n";
  out += "kvoffload_unrouted_requests_total{status=\"405\"} " + std::to_string(unrouted_[1].load()) +
         "\n";
  out += "# HELP kvoffload_cert_reloads_total Serving certificate reloads by result.\n";
  out += "# TYPE kvoffload_cert_reloads_total counter\n";
  out += "kvoffload_cert_reloads_total{result=\"ok\"} " + std::to_string(cert_reloads_ok_.load()) +
         "\n";
  out += "kvoffload_cert_reloads_total{result=\"error\"} " +
         std::to_string(cert_reloads_failed_.load()) + "\n";
  // Absent until a certificate is served: 0 would read as one expired in 1970.
  if (const int64_t not_after = cert_not_after_.load(); not_after != 0) {
    out += "# HELP kvoffload_cert_expiry_timestamp_seconds When the served certificate expires "
           "(Unix seconds).\n";
    out += "# TYPE kvoffload_cert_expiry_timestamp_seconds gauge\n";
    out += "kvoffload_cert_expiry_timestamp_seconds " + std::to_string(not_after) + "\n";
  }
  return out;
}

}  // namespace kvoffload::webhook
