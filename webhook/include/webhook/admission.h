// The decoding layer: an AdmissionReview (admission.k8s.io/v1) body in, an AdmissionReview
// answer out. Every malformed request gets an AdmissionReview error answer (or a 4xx), never an
// exception. Resolution goes through the ClusterReader; the mutation is the pure Mutate(), the
// apply-time checks are ValidateObject().
// Thread-safe if the reader is.
#ifndef KVOFFLOAD_WEBHOOK_ADMISSION_H_
#define KVOFFLOAD_WEBHOOK_ADMISSION_H_

#include <chrono>
#include <string>
#include <string_view>

#include "webhook/cluster_reader.h"
#include "webhook/metrics.h"
#include "webhook/mutator.h"

namespace kvoffload::webhook {

// controller-runtime's limit; the API server itself caps objects at 3 MiB in etcd.
inline constexpr size_t kMaxAdmissionBodyBytes = 7 * 1024 * 1024;

struct AdmissionOptions {
  Mode default_mode = Mode::kVllmNative;
  std::string agent_image;
  // All API server lookups of one admission share this budget (--lookup-timeout). It must stay
  // below the webhook configurations' timeoutSeconds, so that a slow API server gets our clear
  // answer instead of the API server's own timeout.
  std::chrono::milliseconds lookup_budget{2000};
  std::string kserve_namespace = kDefaultKServeNamespace;
};

struct HttpAnswer {
  int status = 200;
  std::string body;
  // Pod admissions: the outcome and why (skip reason, failure type) for the metrics.
  AdmissionResult admission = AdmissionResult::Failed(FailureType::kInternal);
  std::string log_message;  // why, for the access log
  std::string uid;          // the request's, for the access log
  int code = 0;             // a denial's status.code (400, 403, 500), for the access log
  Verdict verdict = Verdict::kError;  // validation requests
};

class AdmissionHandler {
 public:
  // `reader` may be null (no API access): only pod annotations are served. Not owned.
  AdmissionHandler(AdmissionOptions options, ClusterReader* reader)
      : options_(std::move(options)), reader_(reader) {}

  // /mutate-pods: a Pod CREATE, answered with the patch. The body is parsed where it lies when
  // its spare capacity holds kJsonPadding bytes (json_util.h), as the server reserves.
  // `received`: when the request arrived; its lookups share a budget that starts then, so
  // that one queued behind others still answers before the API server's timeout.
  HttpAnswer Handle(std::string_view content_type, const std::string& body,
                    std::chrono::steady_clock::time_point received =
                        std::chrono::steady_clock::now()) const;

  // /validate and /validate-labelled: CREATE and UPDATE of LLMInferenceServices, Namespaces and
  // workloads (Deployment, StatefulSet, Job, LeaderWorkerSet), denied with every error of their
  // kvCacheOffloading specs and admitted with warnings for what is likely wrong. An UPDATE that
  // leaves the checked part as it was is admitted unchecked, so an object stored while the
  // webhook was away can still get finalizers, labels and deletion. `pods_need_label`: the
  // workload's namespace has no kvoffload.io/injection label, so only templates labelled
  // kvoffload.io/inject=true make injected pods.
  HttpAnswer Validate(std::string_view content_type, const std::string& body,
                      bool pods_need_label,
                      std::chrono::steady_clock::time_point received =
                          std::chrono::steady_clock::now()) const;

 private:
  AdmissionOptions options_;
  ClusterReader* reader_;
};

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_ADMISSION_H_
