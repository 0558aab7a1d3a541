#include "webhook/api_status.h"

namespace kvoffload::webhook {

Status ApiServerStatusError(int http_status, const std::string& request,
                            const std::string& message) {
  std::string text = request + ": HTTP " + std::to_string(http_status) + ": " + message;
  // 429 is the API server shedding load (API Priority and Fairness): an outage that passes,
  // like a 503, so an older copy may stand in for it.
  if (http_status < 400 || http_status >= 500 || http_status == 429) {
    return Status::Unavailable(text);
  }
  if (http_status == 401) {
    text += " (the API server does not accept the webhook's credentials: check its "
            "ServiceAccount token, expired, revoked or its ServiceAccount deleted, or with "
            "--kubeconfig the user of the kubeconfig's current context)";
  }
  return Status::FailedPrecondition(text);
}

}  // namespace kvoffload::webhook
