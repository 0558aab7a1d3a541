#include "webhook/metrics.h"

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

void Metrics::RecordAdmission(Outcome outcome, double seconds) {
  admissions_[static_cast<size_t>(outcome)].fetch_add(1, std::memory_order_relaxed);
  size_t bucket = 0;
  while (bucket < kBuckets.size() && seconds > kBuckets[bucket]) ++bucket;
  if (bucket < kBuckets.size()) latency_buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  latency_count_.fetch_add(1, std::memory_order_relaxed);
  latency_sum_ns_.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void Metrics::RecordLookup(ObjectKind kind, LookupResult result) {
  lookups_[static_cast<size_t>(kind)][static_cast<size_t>(result)].fetch_add(
      1, std::memory_order_relaxed);
}

void Metrics::RecordCertReload(bool ok) {
  (ok ? cert_reloads_ok_ : cert_reloads_failed_).fetch_add(1, std::memory_order_relaxed);
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
  out += "# HELP kvoffload_validation_requests_total Apply-time validation requests by verdict.\n";
  out += "# TYPE kvoffload_validation_requests_total counter\n";
  for (size_t i = 0; i < validations_.size(); ++i) {
    out += std::string("kvoffload_validation_requests_total{verdict=\"") +
           VerdictName(static_cast<Verdict>(i)) + "\"} " + std::to_string(validations_[i].load()) +
           "\n";
  }
  out += "# HELP kvoffload_admission_duration_seconds Time to answer an admission request.\n";
  out += "# TYPE kvoffload_admission_duration_seconds histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += latency_buckets_[i].load();
    out += "kvoffload_admission_duration_seconds_bucket{le=\"" + FormatDouble(kBuckets[i]) +
           "\"} " + std::to_string(cumulative) + "\n";
  }
  const uint64_t count = latency_count_.load();
  out += "kvoffload_admission_duration_seconds_bucket{le=\"+Inf\"} " + std::to_string(count) + "\n";
  out += "kvoffload_admission_duration_seconds_sum " +
         FormatDouble(static_cast<double>(latency_sum_ns_.load()) / 1e9) + "\n";
  out += "kvoffload_admission_duration_seconds_count " + std::to_string(count) + "\n";
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
  out += "# HELP kvoffload_cert_reloads_total Serving certificate reloads by result.\n";
  out += "# TYPE kvoffload_cert_reloads_total counter\n";
  out += "kvoffload_cert_reloads_total{result=\"ok\"} " + std::to_string(cert_reloads_ok_.load()) +
         "\n";
  out += "kvoffload_cert_reloads_total{result=\"error\"} " +
         std::to_string(cert_reloads_failed_.load()) + "\n";
  return out;
}

}  // namespace kvoffload::webhook
