#include "webhook/admission.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string_view>

#include "webhook/base64.h"
#include "webhook/json_util.h"
#include "webhook/resolver.h"
#include "webhook/validation.h"
#include "webhook/workload.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kApiVersion[] = "admission.k8s.io/v1";

HttpAnswer Answer(const std::string& uid, json response_fields, std::string log_message) {
  json response = {{"uid", uid}};
  response.update(response_fields);
  json review = {{"apiVersion", kApiVersion}, {"kind", "AdmissionReview"}, {"response", response}};
  HttpAnswer answer;
  answer.body = DumpJson(review);
  answer.log_message = std::move(log_message);
  answer.uid = uid;
  return answer;
}

HttpAnswer Reject(const std::string& uid, int code, const std::string& message) {
  json status = {{"metadata", json::object()},
                 {"status", "Failure"},
                 {"message", message},
                 {"code", code}};
  if (code == 403) status["reason"] = "Forbidden";
  if (code == 400) status["reason"] = "BadRequest";
  if (code == 500) status["reason"] = "InternalError";
  HttpAnswer answer = Answer(uid, {{"allowed", false}, {"status", status}}, message);
  answer.code = code;
  return answer;
}

HttpAnswer Allow(const std::string& uid, const std::vector<std::string>& warnings,
                 std::string why) {
  json fields = {{"allowed", true}};
  if (!warnings.empty()) fields["warnings"] = warnings;
  return Answer(uid, fields, std::move(why));
}

// Checks what every AdmissionReview must carry. Returns the answer for a malformed one; else
// fills `review` and `uid`. The review is read in place (JsonView), never built as a DOM.
// A request's namespace goes into the path of every lookup of its admission. The API server
// only ever sends a namespace's name, but any client that reaches the webhook's port can post a
// review, and "../../apis/..." there would have the webhook read another path with its own
// credentials: "" when `ns` is a name (or absent), else the 400's message.
std::string BadNamespace(const std::string& ns) {
  if (ns.empty() || IsDns1123Label(ns)) return {};
  std::string quoted;
  AppendJsonString(quoted, ns.size() > 64 ? ns.substr(0, 61) + "..." : ns);
  return "request.namespace " + quoted +
         " is no namespace name (lowercase letters, digits and '-', at most 63); the API "
         "server sends only names: check what sent this review";
}

std::optional<HttpAnswer> Decode(std::string_view content_type, const std::string& body,
                                 std::optional<JsonDocument>* review, std::string* uid) {
  // Media type check ignores parameters such as "; charset=utf-8", and case and spaces, which
  // RFC 9110 does not count (the API server itself sends "application/json").
  std::string_view media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  constexpr std::string_view kJson = "application/json";
  if (media.size() != kJson.size() ||
      !std::equal(media.begin(), media.end(), kJson.begin(), [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) == b;
      })) {
    HttpAnswer answer;
    answer.status = 415;
    answer.body =
        "Content-Type must be application/json, got \"" + std::string(content_type) + "\"\n";
    answer.log_message = "wrong content type";
    return answer;
  }
  if (body.size() > kMaxAdmissionBodyBytes) {
    HttpAnswer answer;
    answer.status = 413;
    answer.body = "request body over 7 MiB\n";
    answer.log_message = "body too large";
    return answer;
  }
  Result<JsonDocument> parsed =
      JsonDocument::Parse(body, "AdmissionReview", body.capacity() - body.size());
  if (!parsed.ok()) return Reject("", 400, parsed.status().message());
  const JsonView root = parsed->Root();
  if (!root.IsObject() || root["kind"].String() != "AdmissionReview") {
    return Reject("", 400, "body is not an AdmissionReview (kind must be AdmissionReview)");
  }
  if (root["apiVersion"].String() != kApiVersion) {
    return Reject("", 400,
                  "AdmissionReview apiVersion \"" + StringAt(root, "apiVersion") +
                      "\" is not supported; configure admissionReviewVersions: [v1]");
  }
  *uid = StringAt(root["request"], "uid");
  if (uid->empty()) return Reject("", 400, "AdmissionReview has no request.uid");
  review->emplace(std::move(*parsed));
  return std::nullopt;
}

// The kinds the validating entries send, by API group.
bool IsValidatedKind(const std::string& group, const std::string& kind) {
  return (group == "serving.kserve.io" &&
          (kind == "LLMInferenceService" || kind == "LLMInferenceServiceConfig")) ||
         (group.empty() && kind == "Namespace") ||
         (group == "apps" && (kind == "Deployment" || kind == "StatefulSet" ||
                              kind == "ReplicaSet" || kind == "DaemonSet")) ||
         (group == "batch" && (kind == "Job" || kind == "CronJob")) ||
         (group == "leaderworkerset.x-k8s.io" && kind == "LeaderWorkerSet");
}

// What the checks read: the default-config annotation of a Namespace, the pod templates of a
// workload, the spec of the rest. A workload's other fields change without its pods changing:
// the Deployment controller scales a ReplicaSet by updating spec.replicas, and checked in full
// against today's LLMInferenceService, an old ReplicaSet whose template no longer passed was
// refused its scale-down, and the rollout stopped with the old pods running.
bool CheckedPartUnchanged(const std::string& kind, const JsonView& object, const JsonView& old) {
  if (!old.IsObject()) return false;
  if (kind == "Namespace") {
    return object["metadata"]["annotations"][kAnnotationDefaultConfig].String() ==
           old["metadata"]["annotations"][kAnnotationDefaultConfig].String();
  }
  const json now = object.ToJson();
  const json before = old.ToJson();
  const std::vector<std::string> templates = PodTemplatePointers(now);
  if (templates.empty()) return now["spec"] == before["spec"];
  if (PodTemplatePointers(before) != templates) return false;
  return std::all_of(templates.begin(), templates.end(), [&](const std::string& pointer) {
    const json::json_pointer p(pointer);
    return before.contains(p) && now.contains(p) && now[p] == before[p];
  });
}

HttpAnswer Verdicted(HttpAnswer answer, Verdict verdict) {
  answer.verdict = verdict;
  return answer;
}

HttpAnswer Counted(HttpAnswer answer, AdmissionResult result) {
  answer.admission = result;
  return answer;
}

}  // namespace

HttpAnswer AdmissionHandler::Validate(std::string_view content_type, const std::string& body,
                                      bool pods_need_label, Clock::time_point received) const {
  std::optional<JsonDocument> review;
  std::string uid;
  if (std::optional<HttpAnswer> bad = Decode(content_type, body, &review, &uid)) {
    return Verdicted(std::move(*bad), Verdict::kError);
  }
  const JsonView request = review->Root()["request"];
  const JsonView kind = request["kind"];
  const std::string group = StringAt(kind, "group");
  const std::string kind_name = StringAt(kind, "kind");
  if (!IsValidatedKind(group, kind_name) || !StringAt(request, "subResource").empty()) {
    return Verdicted(
        Reject(uid, 400,
               "kv-offload validates LLMInferenceService(Config), Namespace, Deployment, "
               "StatefulSet, ReplicaSet, DaemonSet, Job, CronJob and LeaderWorkerSet objects, "
               "got " +
                   group + "/" + kind_name + " " + StringAt(request, "subResource") +
                   "; check the webhook's rules"),
        Verdict::kError);
  }
  const std::string op = StringAt(request, "operation");
  if (op != "CREATE" && op != "UPDATE") {
    return Verdicted(Allow(uid, {}, "not a CREATE or UPDATE"), Verdict::kSkipped);
  }
  const JsonView object_view = request["object"];
  if (!object_view.IsObject()) {
    return Verdicted(Reject(uid, 400, "AdmissionReview has no request.object"),
                     Verdict::kError);
  }
  const JsonView metadata = object_view["metadata"];
  if (!metadata["deletionTimestamp"].IsNull()) {
    return Verdicted(Allow(uid, {}, "being deleted"), Verdict::kSkipped);
  }
  if (op == "UPDATE" && CheckedPartUnchanged(kind_name, object_view, request["oldObject"])) {
    return Verdicted(Allow(uid, {}, "checked part unchanged"),
                     Verdict::kSkipped);
  }
  std::string ns = StringAt(request, "namespace");
  if (ns.empty()) ns = StringAt(metadata, "namespace");
  if (kind_name == "Namespace") ns = StringAt(metadata, "name");
  if (const std::string bad = BadNamespace(ns); !bad.empty()) {
    return Verdicted(Reject(uid, 400, bad), Verdict::kError);
  }
  // The checks walk an nlohmann value: objects are validated on apply, far less often than
  // pods are admitted.
  const json object = object_view.ToJson();

  ValidationOptions vo;
  vo.default_mode = options_.default_mode;
  vo.agent_image = options_.agent_image;
  vo.pods_need_label = pods_need_label;
  vo.kserve_namespace = options_.kserve_namespace;
  Result<ObjectReport> report = Status::Internal("not run");
  try {
    BudgetReader budget(reader_, received + options_.lookup_budget);
    report = ValidateObject(object, ns, vo, reader_ != nullptr ? &budget : nullptr);
  } catch (const json::exception& e) {
    // An object the API server accepted but nlohmann cannot walk: not ours to refuse.
    report = Status::Internal(std::string("cannot read the object: ") + e.what());
  }
  if (!report.ok()) {
    // The pod webhook checks again when pods are created: never block an apply on a lookup.
    const std::string what = DescribeObject(object, ns);
    return Verdicted(Allow(uid,
                           {"kv-offload could not check " + what + " (" +
                            report.status().message().substr(0, 60) +
                            "); its pods are checked when created"},
                           "not checked: " + report.status().message()),
                     Verdict::kError);
  }
  if (!report->errors.empty()) {
    return Verdicted(Reject(uid, 403, report->denial), Verdict::kDenied);
  }
  if (!report->checked) {
    return Verdicted(Allow(uid, {}, "nothing to check"), Verdict::kSkipped);
  }
  const Verdict verdict = report->warnings.empty() ? Verdict::kAllowed : Verdict::kWarned;
  return Verdicted(Allow(uid, report->warnings, "checked " + report->object),
                   verdict);
}

HttpAnswer AdmissionHandler::Handle(std::string_view content_type, const std::string& body,
                                    Clock::time_point received) const {
  std::optional<JsonDocument> review;
  std::string uid;
  if (std::optional<HttpAnswer> bad = Decode(content_type, body, &review, &uid)) {
    return Counted(std::move(*bad), AdmissionResult::Failed(FailureType::kBadRequest));
  }
  const JsonView request = review->Root()["request"];

  const JsonView kind = request["kind"];
  if (StringAt(kind, "kind") != "Pod" || !StringAt(kind, "group").empty() ||
      !StringAt(request, "subResource").empty()) {
    return Counted(Reject(uid, 400,
                          "kv-offload mutates Pods only, got " + StringAt(kind, "group") + "/" +
                              StringAt(kind, "kind") + " " + StringAt(request, "subResource") +
                              "; check the webhook's rules"),
                   AdmissionResult::Failed(FailureType::kBadRequest));
  }
  if (StringAt(request, "operation") != "CREATE") {
    return Counted(Allow(uid, {}, "not a CREATE"),
                   AdmissionResult::Skipped(SkipReason::kNotCreate));
  }
  const JsonView pod = request["object"];
  if (!pod.IsObject()) {
    return Counted(Reject(uid, 400, "AdmissionReview has no request.object"),
                   AdmissionResult::Failed(FailureType::kBadRequest));
  }
  if (OptedOut(pod)) {
    return Counted(Allow(uid, {}, "opted out"), AdmissionResult::Skipped(SkipReason::kOptedOut));
  }

  std::string ns = StringAt(request, "namespace");
  if (ns.empty()) ns = StringAt(pod["metadata"], "namespace");
  if (const std::string bad = BadNamespace(ns); !bad.empty()) {
    return Counted(Reject(uid, 400, bad), AdmissionResult::Failed(FailureType::kBadRequest));
  }

  BudgetReader budget(reader_, received + options_.lookup_budget);
  Result<Resolution> resolution = Resolve(pod, ns, reader_ != nullptr ? &budget : nullptr,
                                              options_.kserve_namespace);
  if (!resolution.ok()) {
    if (resolution.status().code() == StatusCode::kInvalidArgument) {
      return Counted(Reject(uid, 403, resolution.status().message()),
                     AdmissionResult::Failed(FailureType::kInvalidSpec));
    }
    return Counted(Reject(uid, 500, resolution.status().message()),
                   AdmissionResult::Failed(FailureType::kLookup));
  }
  if (!resolution->spec) {
    std::vector<std::string> warnings;
    if (OptedIn(pod)) {
      warnings.push_back(
          "kvoffload.io/inject=true but no kvCacheOffloading spec was found for this pod");
    }
    return Counted(Allow(uid, warnings, "no spec"), AdmissionResult::Skipped(SkipReason::kNoSpec));
  }

  const std::string source = resolution->source.description;
  // The review is not read again: its document moves into the input, the pod is not copied.
  Mutation mutation =
      Mutate(MutationInput(std::move(*review), pod, ns, std::move(*resolution),
                           {options_.default_mode, options_.agent_image}));
  if (!mutation.allowed) {
    return Counted(Reject(uid, 403, mutation.denial),
                   AdmissionResult::Failed(FailureType::kRejected));
  }
  if (mutation.patch.empty()) {
    return Counted(Allow(uid, mutation.warnings, "already injected"),
                   AdmissionResult::Skipped(SkipReason::kAlreadyInjected));
  }
  // Assembled by hand around the base64 patch: it needs no escaping, and running a few KB of
  // it through the JSON serializer was a fifth of the cost of an admission.
  std::string answer;
  // Sized once: growing it by doubling copied the patch's base64 (5 KB for a KServe pod) again.
  answer.reserve(256 + 2 * uid.size() + 4 * (mutation.patch.size() + 2) / 3);
  answer = R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":)";
  AppendJsonString(answer, uid);
  answer += R"(,"allowed":true,"patchType":"JSONPatch","patch":")";
  AppendBase64(answer, mutation.patch);
  answer += '"';
  if (!mutation.warnings.empty()) {
    answer += R"(,"warnings":)";
    answer += DumpJson(json(mutation.warnings));
  }
  answer += "}}";
  HttpAnswer injected;
  injected.body = std::move(answer);
  injected.admission = AdmissionResult::Injected();
  injected.log_message = "injected from " + source;
  injected.uid = uid;
  return injected;
}

}  // namespace kvoffload::webhook
