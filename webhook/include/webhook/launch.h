// How a container starts vLLM, and so where `--kv-transfer-config` has to go for vLLM to see it.
// Reads the container's command, args and env (as the pod spec holds them) without running
// anything; pure functions (each thread keeps its last plan, keyed by all it reads),
// thread-safe. The forms, and why each is handled as it is, are in docs/decisions.md ("The vLLM
// flag").
#ifndef KVOFFLOAD_WEBHOOK_LAUNCH_H_
#define KVOFFLOAD_WEBHOOK_LAUNCH_H_

#include <string>
#include <string_view>

#include "webhook/json_util.h"

namespace kvoffload::webhook {

// Where our flag goes.
enum class FlagRoute {
  kArgs,                    // appended to args: vLLM (or a script's "$@") receives it as is
  kArgsForEval,             // appended to args, shell-quoted: a script eval's its "$@"
  kAdditionalArgsEnv,       // appended to VLLM_ADDITIONAL_ARGS, which the script expands
  kAdditionalArgsEnvForEval,  // the same, shell-quoted: the script eval's the variable
  kUnreachable,             // the script hands vLLM nothing we can set
};

struct LaunchPlan {
  FlagRoute route = FlagRoute::kUnreachable;
  // A `sh -c SCRIPT` with nothing after SCRIPT: the first argument appended would become $0,
  // not $1, so a placeholder $0 ("--", as KServe's templates use) goes first.
  bool needs_arg0 = false;
  // The user already passes a --kv-transfer-config of their own; `user_flag_where` says where
  // ("args", "the launch script", "VLLM_ADDITIONAL_ARGS") and `user_flag_value` holds its value
  // when it can be read (shell quotes removed).
  bool has_user_flag = false;
  std::string user_flag_where;
  std::string user_flag_value;
  // Its value is a shell expansion (`--kv-transfer-config "$KV"`): set at run time, not
  // readable here.
  bool user_flag_expanded = false;
  // It is given key by key (`--kv-transfer-config.kv_connector=X`), which vLLM applies over a
  // whole --kv-transfer-config wherever that stands: user_flag_value is the keys as one object.
  bool user_flag_dotted = false;
  // How many flags of the user's vLLM may get, from every place (vLLM takes the last, which
  // user_flag_value need not be where there are several).
  size_t user_flags = 0;
  // vLLM already gets a --shutdown-timeout (in args, the script, or VLLM_ADDITIONAL_ARGS).
  bool has_shutdown_timeout = false;
  // kUnreachable for a reason other than a script that forwards nothing: what, and the fix.
  std::string unreachable_why;
  // The script expands VLLM_ADDITIONAL_ARGS, whose value comes through valueFrom or envFrom
  // and so cannot be read: a --kv-transfer-config there is not seen.
  bool additional_args_unseen = false;
  // The route through VLLM_ADDITIONAL_ARGS where the script expands its literal value word by
  // word (kUnreachable elsewhere), whichever `route` is: a flag appended there comes after the
  // user's own in it, whatever order the script expands it and its arguments in.
  FlagRoute additional_args_route = FlagRoute::kUnreachable;
};

// Reads `container` (a Pod's container object, its envFrom too) and `additional_args`, its env
// entry that sets VLLM_ADDITIONAL_ARGS (the last one where the name repeats, as the kubelet
// keeps the last; absent when none). The caller passes the entry because it has searched the env already, and
// a KServe container's env has about a hundred entries. Never fails: what it cannot reach is
// kUnreachable, and the caller warns.
LaunchPlan PlanLaunch(const JsonView& container, const JsonView& additional_args);

// `text` as one shell word: single-quoted, with each ' written as '\''.
std::string ShellQuote(std::string_view text);

// One shell word read as the shell reads it without expansions: quotes removed, backslash
// escapes applied (what ShellQuote wrote comes back).
std::string ShellUnquote(std::string_view word);

// Whether a script evals what `route` hands it, so that the argument must be shell-quoted.
bool RouteEvals(FlagRoute route);

// The argument that carries `config_json` along `route` (kUnreachable: empty).
std::string FlagArgument(FlagRoute route, std::string_view config_json);

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_LAUNCH_H_
