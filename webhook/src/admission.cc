#include "webhook/admission.h"

#include <openssl/evp.h>

#include "webhook/json_util.h"
#include "webhook/resolver.h"

namespace kvoffload::webhook {
namespace {

using nlohmann::json;

constexpr char kApiVersion[] = "admission.k8s.io/v1";

std::string Base64(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(data.data()),
                                static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

HttpAnswer Answer(const std::string& uid, json response_fields, Outcome outcome,
                  std::string log_message) {
  json response = {{"uid", uid}};
  response.update(response_fields);
  json review = {{"apiVersion", kApiVersion}, {"kind", "AdmissionReview"}, {"response", response}};
  return {200, review.dump(-1, ' ', false, json::error_handler_t::replace), outcome,
          std::move(log_message)};
}

HttpAnswer Reject(const std::string& uid, int code, const std::string& message, Outcome outcome) {
  json status = {{"metadata", json::object()},
                 {"status", "Failure"},
                 {"message", message},
                 {"code", code}};
  if (code == 403) status["reason"] = "Forbidden";
  if (code == 400) status["reason"] = "BadRequest";
  if (code == 500) status["reason"] = "InternalError";
  return Answer(uid, {{"allowed", false}, {"status", status}}, outcome, message);
}

HttpAnswer Allow(const std::string& uid, const std::vector<std::string>& warnings, Outcome outcome,
                 std::string why) {
  json fields = {{"allowed", true}};
  if (!warnings.empty()) fields["warnings"] = warnings;
  return Answer(uid, fields, outcome, std::move(why));
}

}  // namespace

HttpAnswer AdmissionHandler::Handle(std::string_view content_type, std::string_view body) const {
  // Media type check ignores parameters such as "; charset=utf-8".
  const std::string_view media = content_type.substr(0, content_type.find(';'));
  if (media != "application/json") {
    return {415, "Content-Type must be application/json, got \"" + std::string(content_type) + "\"\n",
            Outcome::kError, "wrong content type"};
  }
  if (body.size() > kMaxAdmissionBodyBytes) {
    return {413, "request body over 7 MiB\n", Outcome::kError, "body too large"};
  }
  Result<json> review = ParseJson(body, "AdmissionReview");
  if (!review.ok()) return Reject("", 400, review.status().message(), Outcome::kError);
  if (!review->is_object() || StringAt(*review, "kind") != "AdmissionReview") {
    return Reject("", 400, "body is not an AdmissionReview (kind must be AdmissionReview)",
                  Outcome::kError);
  }
  if (StringAt(*review, "apiVersion") != kApiVersion) {
    return Reject("", 400,
                  "AdmissionReview apiVersion \"" + StringAt(*review, "apiVersion") +
                      "\" is not supported; configure admissionReviewVersions: [v1]",
                  Outcome::kError);
  }
  const json& request = review->contains("request") ? (*review)["request"] : json();
  const std::string uid = StringAt(request, "uid");
  if (uid.empty()) return Reject("", 400, "AdmissionReview has no request.uid", Outcome::kError);

  const json& kind = request.contains("kind") ? request["kind"] : json();
  if (StringAt(kind, "kind") != "Pod" || !StringAt(kind, "group").empty() ||
      !StringAt(request, "subResource").empty()) {
    return Reject(uid, 400,
                  "kv-offload mutates Pods only, got " + StringAt(kind, "group") + "/" +
                      StringAt(kind, "kind") + " " + StringAt(request, "subResource") +
                      "; check the webhook's rules",
                  Outcome::kError);
  }
  if (StringAt(request, "operation") != "CREATE") {
    return Allow(uid, {}, Outcome::kSkipped, "not a CREATE");
  }
  if (!request.contains("object") || !request["object"].is_object()) {
    return Reject(uid, 400, "AdmissionReview has no request.object", Outcome::kError);
  }
  const json& pod = request["object"];
  const json& metadata = pod.contains("metadata") ? pod["metadata"] : json();
  const json& labels = metadata.is_object() && metadata.contains("labels") ? metadata["labels"]
                                                                           : json();
  const std::string inject_label = StringAt(labels, kLabelInject);
  if (inject_label == "false") return Allow(uid, {}, Outcome::kSkipped, "opted out");

  std::string ns = StringAt(request, "namespace");
  if (ns.empty()) ns = StringAt(metadata, "namespace");

  Result<Resolution> resolution = Resolve(pod, ns, reader_);
  if (!resolution.ok()) {
    if (resolution.status().code() == StatusCode::kInvalidArgument) {
      return Reject(uid, 403, resolution.status().message(), Outcome::kDenied);
    }
    return Reject(uid, 500, resolution.status().message(), Outcome::kError);
  }
  if (!resolution->spec) {
    std::vector<std::string> warnings;
    if (inject_label == "true") {
      warnings.push_back(
          "kvoffload.io/inject=true but no kvCacheOffloading spec was found for this pod");
    }
    return Allow(uid, warnings, Outcome::kSkipped, "no spec");
  }

  MutationInput in;
  in.pod = pod;
  in.namespace_name = ns;
  in.spec = std::move(*resolution->spec);
  in.source = resolution->source;
  in.default_mode = options_.default_mode;
  in.agent_image = options_.agent_image;
  in.replicas = resolution->replicas;
  in.pvcs = std::move(resolution->pvcs);
  Mutation mutation = Mutate(in);
  if (!mutation.allowed) return Reject(uid, 403, mutation.denial, Outcome::kDenied);
  if (mutation.patch.empty()) {
    return Allow(uid, mutation.warnings, Outcome::kUnchanged, "already injected");
  }
  json fields = {{"allowed", true},
                 {"patchType", "JSONPatch"},
                 {"patch", Base64(mutation.patch.dump(-1, ' ', false, json::error_handler_t::replace))}};
  if (!mutation.warnings.empty()) fields["warnings"] = mutation.warnings;
  return Answer(uid, fields, Outcome::kInjected, "injected from " + in.source.description);
}

}  // namespace kvoffload::webhook
