// What an API server's HTTP status means to the webhook: an outage, which the lookup cache may
// bridge with an older copy, or an answer, which must show at once (an older copy would hide a
// broken credential or RBAC for the cache's stale TTL); and, where the cause is ours to fix,
// what to fix.
#ifndef KVOFFLOAD_WEBHOOK_API_STATUS_H_
#define KVOFFLOAD_WEBHOOK_API_STATUS_H_

#include <string>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

// The error for `http_status` (not 200, 403 or 404, which the client reads itself) answering
// `request` ("GET <path>"), with the API server's `message`: Unavailable for an outage (5xx,
// 429 overload, anything not 4xx), FailedPrecondition for the other 4xx.
Status ApiServerStatusError(int http_status, const std::string& request,
                            const std::string& message);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_API_STATUS_H_
