// The mutation: pod JSON + resolved spec -> RFC 6902 patch + warnings, or a denial.
// Pure functions (no I/O, no clock; the only state is each thread's last results, which the
// pods of one workload share, keyed by all they depend on): the webhook and `inject` both call
// Mutate(), and the golden tests pin its output. Mutate() is two steps: CheckMutation() finds
// every reason to refuse the pod and settles what the patch needs, BuildPatch() then writes the
// patch and cannot refuse. Thread-safe.
#ifndef KVOFFLOAD_WEBHOOK_MUTATOR_H_
#define KVOFFLOAD_WEBHOOK_MUTATOR_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/status.h"
#include "webhook/json_util.h"
#include "webhook/quantity.h"
#include "webhook/spec.h"

namespace kvoffload::webhook {

// Names fixed by the design contract (docs/design.md).
inline constexpr char kAnnotationConfig[] = "kvoffload.io/config";
inline constexpr char kAnnotationDefaultConfig[] = "kvoffload.io/default-config";
inline constexpr char kAnnotationContainer[] = "kvoffload.io/container";
inline constexpr char kAnnotationMode[] = "kvoffload.io/mode";
inline constexpr char kAnnotationStatus[] = "kvoffload.io/status";
inline constexpr char kAnnotationVllm[] = "kvoffload.io/vllm";
inline constexpr char kLabelInject[] = "kvoffload.io/inject";
inline constexpr char kLabelTier[] = "kvoffload.io/tier";
inline constexpr char kAgentVolume[] = "kvoffload-agent";
inline constexpr char kAgentMountPath[] = "/opt/kvoffload";
inline constexpr char kAgentInitContainer[] = "kvoffload-agent-install";
// Where the install init container mounts the agent volume (the image's own /opt/kvoffload
// must stay visible to it, so it cannot mount there).
inline constexpr char kAgentInstallDest[] = "/kvoffload-dest";
inline constexpr char kAgentLibrary[] = "/opt/kvoffload/lib/libkvoffload.so";
inline constexpr char kAgentPythonPath[] = "/opt/kvoffload/python";
// vLLM's --shutdown-timeout in agent mode when the launch sets none: vLLM's default, 0, stops
// the engine at once on SIGTERM, before the adapter writes pinned-only blocks back to a
// persistent tier (its budget is 10 s). Below Kubernetes' default 30 s grace period.
inline constexpr int kAgentShutdownTimeoutSeconds = 20;
// vLLM's multiproc executor (every tensor- or pipeline-parallel pod, and any pod of vLLM's CPU
// build) waits this long for its worker processes to exit, then kills them; its default, 5 s,
// cut the adapter's write-back in the workers to 4 s. Set in agent mode unless the container
// sets it: the write-back budget (10 s) and the adapter's margin (1 s), and within
// kAgentShutdownTimeoutSeconds.
inline constexpr char kWorkerShutdownEnv[] = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS";
inline constexpr char kAgentWorkerShutdownSeconds[] = "11";

// Why the status annotation says vllmFlagInjected=false (its "vllmFlagReason").
// The container is not known to run vLLM: no LLMInferenceService labels, no
// kvoffload.io/vllm=true.
inline constexpr char kFlagReasonNotVllm[] = "not-vllm";
// The user's own --kv-transfer-config reaches vLLM and was kept.
inline constexpr char kFlagReasonUserFlag[] = "user-flag";
// As above, but theirs does not parse as JSON where vLLM reads it.
inline constexpr char kFlagReasonUserFlagInvalid[] = "user-flag-invalid-json";
// The launch script hands vLLM neither its arguments nor VLLM_ADDITIONAL_ARGS.
inline constexpr char kFlagReasonLaunchDropsArgs[] = "launch-drops-args";

// What KServe's labels make of a pod. Every pod of an LLMInferenceService is labelled
// app.kubernetes.io/part-of=llminferenceservice and app.kubernetes.io/name=<service>; only its
// workload pods (app.kubernetes.io/component=llminferenceservice-workload[-prefill|-worker|
// -leader], kserve.io/component=workload) run vLLM. The router's scheduler carries the same
// part-of and name: it is kOther, and neither the service's spec nor a namespace default
// reaches it. A pod with part-of and no component label is taken for a workload pod (how
// such pods are written by hand).
enum class KServePod { kNone, kWorkload, kOther };
KServePod KServePodKind(const JsonView& labels);

// The role whose spec a KServe workload pod gets: its llm-d.ai/role label, else "prefill" for
// the prefill LeaderWorkerSet's pods (component ...-leader-prefill, ...-worker-prefill), which
// KServe leaves without a role label where the prefill has a leader template (its workers are
// then no part of the InferencePool) but which run the prefill's vLLM with its tiers.
std::string KServeRole(const JsonView& labels);

enum class Mode { kVllmNative, kAgent };
const char* ModeName(Mode mode);
Result<Mode> ParseMode(const std::string& text);

// What the resolver learned about a pvc.ref PVC.
struct PvcInfo {
  bool exists = false;
  std::vector<std::string> access_modes;  // spec.accessModes
  std::optional<Quantity> capacity;        // status.capacity.storage, else the request
};

struct Resolution;  // webhook/resolver.h

// The webhook flags (`serve` and `inject` take the same ones) that shape the patch.
struct MutationOptions {
  Mode default_mode = Mode::kVllmNative;  // overridden by the kvoffload.io/mode annotation
  std::string agent_image;                 // --agent-image; required for agent mode
};

struct MutationInput {
  // The only ways to build an input, so every caller hands Mutate() the same facts.
  // `workload_replicas`: pods of the workload the pod template belongs to, when the caller
  // sees it (offline, apply time); the larger of it and the resolver's count is used.
  // REQUIRES: resolution.spec is set (a pod without a spec is never mutated).
  // The pod as parsed from the AdmissionReview: `pod` is a value inside `document`.
  MutationInput(JsonDocument document, JsonView pod, std::string namespace_name,
                Resolution resolution, const MutationOptions& options, int workload_replicas = 1);
  // A pod held as an nlohmann value (offline, apply-time checks, tests): read from a copy.
  MutationInput(const nlohmann::json& pod, std::string namespace_name, Resolution resolution,
                const MutationOptions& options, int workload_replicas = 1);

  JsonDocument document;  // holds what `pod` reads
  JsonView pod;           // the Pod (or a pod template shaped as one: metadata + spec)
  std::string namespace_name;
  OffloadSpec spec;
  SpecSource source;
  MutationOptions options;
  int replicas = 1;  // of the owning workload, when known
  // pvc.ref PVCs by name. A name missing from the map was not checked (no API access).
  std::map<std::string, PvcInfo> pvcs;
};

// kvoffload.io/inject=false: the pod is left alone before anything is looked up or checked.
// The one place that decides it; the webhook, `inject` and the apply-time checks all ask here.
bool OptedOut(const JsonView& pod);
// kvoffload.io/inject=true: the pod asked to be injected.
bool OptedIn(const JsonView& pod);

// What a mutation derives from the spec and the facts found about it alone, never from the rest
// of the pod: the same for every pod of a workload, so each thread keeps the last.
struct FromSpec {
  std::string tiers_text;       // the KVOFFLOAD_TIERS value (TiersEnv), as JSON text
  std::string config_hash;      // ConfigHash
  std::string transfer_config;  // our --kv-transfer-config value (KvTransferConfig), as text
  // The flag with that value as each launch route passes it (FlagArgument): as it is (kArgs,
  // kAdditionalArgsEnv) and shell-quoted for a script that evals it (the *ForEval routes).
  std::string flag_argument;
  std::string flag_argument_for_eval;
  // The two as JSON strings, as the args route appends them: escaping the flag's JSON again
  // for every pod cost more than the rest of the args.
  std::string flag_argument_json;
  std::string flag_argument_for_eval_json;
  // Per tier: its volume and its container mount, as JSON text (added where missing).
  std::vector<std::string> tier_volumes;
  std::vector<std::string> tier_mounts;
  // Our env variables that follow from the spec alone, in the order they are set, each with
  // its entry {"name":...,"value":...} as JSON text: escaping the tiers' JSON into a string
  // for every pod cost more than the rest of the env.
  struct Env {
    std::string name;
    std::string value;
    std::string entry;
  };
  std::vector<Env> env;
};

// What CheckMutation() settled for BuildPatch(): with it, building the patch cannot fail.
struct MutationPlan {
  Mode mode = Mode::kVllmNative;
  size_t container = 0;  // index of the target container in spec.containers
  std::string container_name;
  std::shared_ptr<const FromSpec> from_spec;  // shared by the pods of a workload, never null
  // Per tier: its volume is missing from the pod and is added (KServe may have rendered some).
  std::vector<bool> add_tier_volume;
  bool add_agent_volume = false;  // the agent's volume is missing (added in agent mode)
  // The target container's ephemeral-storage request once the added emptyDir tiers count.
  std::optional<Quantity> ephemeral_request;
  bool any_shared = false;  // a pvc.ref tier is ReadWriteMany
  // The target container's volumeMounts' names and mount paths, read once for the checks and
  // the patch (views into the input's document, which outlives the plan's use).
  std::vector<std::string_view> mount_names;
  std::vector<std::string_view> mount_paths;
  // The status annotation already carries config_hash: nothing to patch.
  bool already_injected = false;
  // Our status annotation under another hash: an earlier injection whose parts Mutate() takes
  // out before injecting again.
  std::optional<nlohmann::json> earlier_status;
  std::vector<std::string> warnings;  // the checks' warnings, first in the answer
};

struct CheckedMutation {
  // Every reason to refuse the pod, each a sentence naming the field and the fix, in a fixed
  // order. Empty: `plan` is complete.
  std::vector<std::string> denials;
  MutationPlan plan;
};

CheckedMutation CheckMutation(const MutationInput& input);

// The patch for a checked input, as compact JSON text (an array of operations). Appends its own
// warnings to `warnings`.
// REQUIRES: `plan` is CheckMutation(input).plan with no denials and not already_injected.
std::string BuildPatch(const MutationInput& input, const MutationPlan& plan,
                       std::vector<std::string>* warnings);

struct Mutation {
  bool allowed = true;
  std::vector<std::string> denials;  // set when !allowed: every reason
  std::string denial;                // the denials as one message (JoinDenials)
  // The RFC 6902 patch as compact JSON text, as the AdmissionReview carries it (base64);
  // empty: nothing to change.
  std::string patch;
  std::vector<std::string> warnings;  // each under 120 characters
};

// CheckMutation(), then BuildPatch() when nothing is refused.
Mutation Mutate(const MutationInput& input);

// One denial as it is; several as "2 problems: (1) <first>; (2) <second>", so a user fixes
// them all in one round.
std::string JoinDenials(const std::vector<std::string>& denials);

// The hash in the status annotation and KVOFFLOAD_CONFIG_HASH: 16 hex digits of SHA-256 over
// the canonical spec, the mode, the target container, the KVOFFLOAD_TIERS value and (agent
// mode) the agent image. The same meaning gives the same hash, so reinvocation is a no-op.
std::string ConfigHash(const OffloadSpec& spec, Mode mode, const std::string& container,
                       const nlohmann::json& tiers_env, const std::string& agent_image);

// Which container gets the tiers: annotation kvoffload.io/container, else "main", else the
// first. -1 with `error` set when the annotation names a missing container or there is none.
int TargetContainer(const JsonView& pod, std::string* error);

// The warning for a pvc.ref tier whose PVC the webhook was told nothing about (offline, with
// the PVC not in the input); in agent mode also what the agent does without the PVC's facts.
std::string UncheckedPvcWarning(const std::string& pvc_name, Mode mode);

// The --kv-transfer-config value for `spec` in `mode` (compact JSON).
nlohmann::json KvTransferConfig(const OffloadSpec& spec, Mode mode);

// The KVOFFLOAD_TIERS value: [{"path","kind","capacityBytes","persistent","shared"}].
// capacityBytes is the tier's size less TierHeadroomBytes (kvoffload/tier_headroom.h): what
// `du` counts besides block files (directories, the ledger) must fit under an emptyDir's
// sizeLimit too. 0 for a pvc.ref whose PVC was not read: the agent sizes that tier itself.
nlohmann::json TiersEnv(const OffloadSpec& spec, const std::map<std::string, PvcInfo>& pvcs);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_MUTATOR_H_
