#include "webhook/launch.h"

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "webhook/json_util.h"

namespace kvoffload::webhook {
namespace {

constexpr std::array<std::string_view, 2> kFlagNames = {"--kv-transfer-config",
                                                        "--kv_transfer_config"};
constexpr std::string_view kAdditionalArgs = "VLLM_ADDITIONAL_ARGS";

std::string_view BaseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool IsShell(std::string_view program) {
  const std::string_view base = BaseName(program);
  return base == "sh" || base == "bash" || base == "dash" || base == "ash" || base == "zsh" ||
         base == "ksh";
}

// Where the program a launch runs stands in `argv`, past the wrappers images put in front of
// it (`env NAME=value`, `timeout 1h`, `tini --`, `dumb-init`, `nice -n 5`, `nohup`): a shell
// behind one was taken for no shell, and our flag became its $0. Their options that take a
// value are skipped with it.
size_t ProgramIndex(const std::vector<std::string_view>& argv) {
  size_t i = 0;
  while (i < argv.size()) {
    const std::string_view w = BaseName(argv[i]);
    // Options of `w` that take the next word as their value.
    std::vector<std::string_view> with_value;
    if (w == "env") {
      with_value = {"-u", "--unset", "-C", "--chdir"};
    } else if (w == "timeout") {
      with_value = {"-s", "--signal", "-k", "--kill-after"};
    } else if (w == "tini") {
      with_value = {"-p", "-e"};
    } else if (w == "dumb-init") {
      with_value = {"-r", "--rewrite"};
    } else if (w == "nice") {
      with_value = {"-n", "--adjustment"};
    } else if (w != "nohup") {
      return i;
    }
    for (++i; i < argv.size(); ++i) {
      const std::string_view a = argv[i];
      if (a == "--") {
        ++i;
        break;
      }
      if (std::find(with_value.begin(), with_value.end(), a) != with_value.end()) {
        ++i;
      } else if (w == "env" && a.find('=') != std::string_view::npos && a[0] != '-') {
        // NAME=value
      } else if (a.empty() || a[0] != '-') {
        break;
      }
    }
    // timeout's duration comes before the program.
    if (w == "timeout" && i < argv.size()) ++i;
  }
  return i;
}

// Index of the `-c` option (also bundled: `-ec`, `-lc`) in the argv of a shell at `shell`, or
// nullopt when the shell runs a script file instead. `-o NAME` takes the next word; bash's long
// options are no `-c` (`--norc`, `--rcfile FILE` and `--init-file FILE` with theirs).
std::optional<size_t> ShellCommandOption(const std::vector<std::string_view>& argv,
                                         size_t shell) {
  for (size_t i = shell + 1; i < argv.size(); ++i) {
    const std::string_view a = argv[i];
    if (a == "-o" || a == "+o" || a == "--rcfile" || a == "--init-file") {
      ++i;
      continue;
    }
    if (a.size() < 2 || (a[0] != '-' && a[0] != '+') || a == "--") return std::nullopt;
    if (a.starts_with("--")) continue;
    if (a.find('c') != std::string_view::npos) return i;
  }
  return std::nullopt;
}

// Reads one shell word as the shell would without expansions: quotes removed, backslash
// escapes applied. Good enough for a flag value someone wrote by hand.
std::string UnquoteWord(std::string_view word) {
  std::string out;
  for (size_t i = 0; i < word.size(); ++i) {
    const char c = word[i];
    if (c == '\'') {
      const size_t end = word.find('\'', i + 1);
      if (end == std::string_view::npos) return out + std::string(word.substr(i + 1));
      out += word.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      for (++i; i < word.size() && word[i] != '"'; ++i) {
        if (word[i] == '\\' && i + 1 < word.size()) ++i;
        out += word[i];
      }
    } else if (c == '\\' && i + 1 < word.size()) {
      out += word[++i];
    } else {
      out += c;
    }
  }
  return out;
}

// The value of a flag at `pos` of `text`, up to the end of its shell word. `split_only`: the
// text reaches vLLM through an unquoted expansion (`$VLLM_ADDITIONAL_ARGS` without eval),
// which splits it at whitespace and removes no quotes, so the value is the bytes up to the
// next blank as they are.
std::string FlagValueAt(std::string_view text, size_t pos, size_t flag_len,
                        bool split_only = false) {
  size_t i = pos + flag_len;
  if (i < text.size() && text[i] == '=') {
    ++i;
  } else {
    while (i < text.size() && text[i] == ' ') ++i;
  }
  size_t end = i;
  char quote = 0;
  for (; end < text.size(); ++end) {
    const char c = text[end];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (!split_only && (c == '\'' || c == '"')) {
      quote = c;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      break;
    }
  }
  const std::string_view word = text.substr(i, end - i);
  return split_only ? std::string(word) : UnquoteWord(word);
}

// Finds a flag in a list of arguments: `--kv-transfer-config X` or `--kv-transfer-config=X`.
// `parsed_by_shell`: the arguments reach vLLM through eval, which removes a layer of quoting.
bool FindFlagInArgs(const std::vector<std::string_view>& args, bool parsed_by_shell,
                    std::string* value) {
  for (size_t i = 0; i < args.size(); ++i) {
    for (std::string_view flag : kFlagNames) {
      std::string_view raw;
      if (args[i] == flag) {
        raw = i + 1 < args.size() ? args[i + 1] : std::string_view();
      } else if (args[i].size() > flag.size() && args[i].starts_with(flag) &&
                 args[i][flag.size()] == '=') {
        raw = args[i].substr(flag.size() + 1);
      } else {
        continue;
      }
      *value = parsed_by_shell ? UnquoteWord(raw) : std::string(raw);
      return true;
    }
  }
  return false;
}

// Finds a flag anywhere in free text (a script, an env value). `checks_only` is set when every
// occurrence is a glob pattern in a test (`[[ "$*" != *"--kv-transfer-config"* ]]`), i.e. the
// text only asks whether someone else passed the flag.
// `at`, when given, is set to where the flag found starts; `split_only` as for FlagValueAt.
bool FindFlagInText(std::string_view text, std::string* value, bool* defers,
                    size_t* at = nullptr, bool split_only = false) {
  bool found_flag = false;
  *defers = false;
  for (std::string_view flag : kFlagNames) {
    for (size_t pos = text.find(flag); pos != std::string_view::npos;
         pos = text.find(flag, pos + 1)) {
      const bool glob = (pos >= 1 && text[pos - 1] == '*') ||
                        (pos >= 2 && text[pos - 1] == '"' && text[pos - 2] == '*');
      if (glob) {
        *defers = true;
      } else if (!found_flag) {
        found_flag = true;
        *value = FlagValueAt(text, pos, flag.size(), split_only);
        if (at != nullptr) *at = pos;
      }
    }
  }
  return found_flag;
}

// A script's logical lines: backslash-newline continuations joined (inside double quotes too,
// where KServe's `eval "exec vllm serve \` spans many lines), comment lines dropped.
std::vector<std::string> LogicalLines(std::string_view script) {
  std::vector<std::string> kept;
  std::string cur;
  auto keep = [&kept](std::string& line) {
    const size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line[first] != '#') kept.push_back(std::move(line));
    line.clear();
  };
  // Copies the text between newlines whole rather than a character at a time.
  for (size_t at = 0;;) {
    const size_t nl = script.find('\n', at);
    if (nl == std::string_view::npos) {
      cur += script.substr(at);
      break;
    }
    if (nl > at && script[nl - 1] == '\\') {
      cur += script.substr(at, nl - 1 - at);
      cur += ' ';
    } else {
      cur += script.substr(at, nl - at);
      keep(cur);
    }
    at = nl + 1;
  }
  keep(cur);
  return kept;
}

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The words of the simple command around `pos`: from the last separator (; && || | and the
// keywords that start a command list) before it.
std::vector<std::string> CommandWordsBefore(std::string_view line, size_t pos) {
  // Walks back from `pos` to the nearest end of a separator: one pass, where searching for each
  // separator separately read the line seven times for every match in a long eval line.
  static constexpr std::array<std::string_view, 7> kSeparators = {
      ";", "&&", "||", "|", " then ", " do ", " else "};
  size_t start = 0;
  for (size_t end = pos; end > 0 && start == 0; --end) {
    const char last = line[end - 1];
    if (last != ';' && last != '&' && last != '|' && last != ' ') continue;
    for (std::string_view sep : kSeparators) {
      if (end >= sep.size() && line.substr(end - sep.size(), sep.size()) == sep) {
        start = end;
        break;
      }
    }
  }
  std::vector<std::string> words;
  std::string w;
  for (size_t i = start; i < pos; ++i) {
    if (line[i] == ' ' || line[i] == '\t') {
      if (!w.empty()) words.push_back(std::move(w));
      w.clear();
    } else {
      w += line[i];
    }
  }
  if (!w.empty()) words.push_back(std::move(w));
  return words;
}

// Whether the command at `pos` hands what it expands there to a program (a launch), rather than
// testing, printing or storing it. Runs the check on the command's first word.
bool IsLaunch(const std::vector<std::string>& words) {
  if (words.empty()) return true;
  static constexpr std::array<std::string_view, 18> kNotLaunch = {
      "[[", "[",     "test",  "if",     "elif", "while",   "until",  "echo", "printf",
      "for", "case", "local", "declare", "export", "set", "shift", ":",    "!"};
  const std::string& first = words.front();
  for (std::string_view w : kNotLaunch) {
    if (first == w) return false;
  }
  // NAME=value: an assignment keeps the value for later; what happens to it is not visible.
  const size_t eq = first.find('=');
  if (eq != std::string::npos && eq > 0) {
    bool name = true;
    for (size_t i = 0; i < eq; ++i) name = name && IsWordChar(first[i]);
    if (name) return false;
  }
  return true;
}

bool HasWord(const std::vector<std::string>& words, std::string_view word) {
  for (const std::string& w : words) {
    if (w == word) return true;
  }
  return false;
}

// FindFlagInText over a script's logical lines, without its comments and the commands that
// only print or test text (a comment or an echo that names the flag passed vLLM nothing, and
// once made the webhook leave the pod without one). Assignments stay: a flag kept in a
// variable is likely expanded into the launch later.
bool FindFlagInScript(const std::vector<std::string>& lines, std::string* value, bool* defers) {
  static constexpr std::array<std::string_view, 3> kPrints = {"echo", "printf", ":"};
  bool found = false;
  *defers = false;
  for (const std::string& line : lines) {
    std::string v;
    bool d = false;
    size_t at = 0;
    const bool here = FindFlagInText(line, &v, &d, &at);
    *defers = *defers || d;
    if (!here || found) continue;
    const std::vector<std::string> words = CommandWordsBefore(line, at);
    if (!words.empty() &&
        std::find(kPrints.begin(), kPrints.end(), words.front()) != kPrints.end()) {
      continue;
    }
    found = true;
    *value = std::move(v);
  }
  return found;
}

struct Expansion {
  bool found = false;
  bool for_eval = false;  // expanded, then parsed again by eval
};

// Finds where the script launches something with one of `patterns` expanded, and whether eval
// parses that expansion a second time. An escaped `\$@` inside an eval string is expanded by
// eval itself, once, so it needs no extra quoting.
Expansion FindLaunchExpansion(const std::vector<std::string>& lines,
                              std::initializer_list<std::string_view> patterns) {
  for (const std::string& line : lines) {
    for (std::string_view p : patterns) {
      for (size_t pos = line.find(p); pos != std::string::npos; pos = line.find(p, pos + 1)) {
        // $VAR must not be the prefix of a longer name ($VLLM_ADDITIONAL_ARGS_X).
        const size_t end = pos + p.size();
        if (p.back() != '}' && p.back() != '@' && p.back() != '*' && end < line.size() &&
            IsWordChar(line[end])) {
          continue;
        }
        const std::vector<std::string> words = CommandWordsBefore(line, pos);
        if (!IsLaunch(words)) continue;
        const bool escaped = pos > 0 && line[pos - 1] == '\\';
        return {true, !escaped && HasWord(words, "eval")};
      }
    }
  }
  return {};
}

}  // namespace

std::string ShellQuote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool RouteEvals(FlagRoute route) {
  return route == FlagRoute::kArgsForEval || route == FlagRoute::kAdditionalArgsEnvForEval;
}

std::string FlagArgument(FlagRoute route, std::string_view config_json) {
  if (route == FlagRoute::kUnreachable) return "";
  const std::string flag = std::string(kFlagNames[0]) + "=";
  return flag + (RouteEvals(route) ? ShellQuote(config_json) : std::string(config_json));
}

namespace {

// What PlanLaunch reads: the command and args as one argv (the first `command_size` elements
// are the command), VLLM_ADDITIONAL_ARGS as a literal value, and whether it is set through
// valueFrom (then there is nothing we can append to).
LaunchPlan PlanArgv(const std::vector<std::string_view>& argv, size_t command_size,
                    std::string_view additional_args, bool additional_args_from_ref) {
  LaunchPlan plan;
  // Anywhere in the launch: an element, a script's text (KServe's renders one from the pod's
  // termination grace period) or the variable.
  for (std::string_view text : argv) {
    for (std::string_view flag : {"--shutdown-timeout", "--shutdown_timeout"}) {
      if (text.find(flag) != std::string_view::npos) plan.has_shutdown_timeout = true;
    }
  }
  for (std::string_view flag : {"--shutdown-timeout", "--shutdown_timeout"}) {
    if (additional_args.find(flag) != std::string_view::npos) plan.has_shutdown_timeout = true;
  }
  auto user_flag = [&plan](std::string where, std::string value) {
    plan.has_user_flag = true;
    plan.user_flag_where = std::move(where);
    plan.user_flag_value = std::move(value);
  };

  std::optional<size_t> dash_c;
  if (const size_t program = ProgramIndex(argv);
      command_size > 0 && program < argv.size() && IsShell(argv[program])) {
    dash_c = ShellCommandOption(argv, program);
  }
  if (!dash_c) {
    // Exec form (or an image entrypoint, or a script file we cannot read): vLLM, or whatever
    // stands in front of it, gets our argument as written.
    // VLLM_ADDITIONAL_ARGS is not read here: vLLM itself never reads it, only scripts that
    // expand it do (a flag there was taken for the user's, and vLLM got none).
    plan.route = FlagRoute::kArgs;
    std::string value;
    if (FindFlagInArgs(argv, /*parsed_by_shell=*/false, &value)) user_flag("args", value);
    return plan;
  }

  if (*dash_c + 1 >= argv.size()) return plan;  // `sh -c` with no script: nothing runs vLLM
  const std::string_view script = argv[*dash_c + 1];
  const std::vector<std::string_view> positional(argv.begin() + static_cast<long>(*dash_c) + 2,
                                                 argv.end());
  plan.needs_arg0 = positional.empty();

  const std::vector<std::string> lines = LogicalLines(script);
  const Expansion v =
      FindLaunchExpansion(lines, {"$VLLM_ADDITIONAL_ARGS", "${VLLM_ADDITIONAL_ARGS"});
  if (Expansion e = FindLaunchExpansion(lines, {"$@", "${@}", "$*", "${*}"}); e.found) {
    plan.route = e.for_eval ? FlagRoute::kArgsForEval : FlagRoute::kArgs;
  } else if (v.found && !additional_args_from_ref) {
    plan.route =
        v.for_eval ? FlagRoute::kAdditionalArgsEnvForEval : FlagRoute::kAdditionalArgsEnv;
  }

  // A user's own flag: in the arguments the script forwards (positional[0] is $0), in the
  // script itself unless the script only uses its own when nobody passed one (KServe's
  // templates check $* first), or in VLLM_ADDITIONAL_ARGS where the script expands it: read
  // as eval reads it, or split at blanks as a plain expansion is.
  std::string value;
  bool defers = false;
  if (positional.size() > 1 &&
      FindFlagInArgs(std::vector<std::string_view>(positional.begin() + 1, positional.end()),
                     plan.route == FlagRoute::kArgsForEval, &value)) {
    user_flag("args", value);
  } else if (FindFlagInScript(lines, &value, &defers) && !defers) {
    user_flag("the launch script", value);
  } else if (v.found && FindFlagInText(additional_args, &value, &defers, nullptr,
                                       /*split_only=*/!v.for_eval)) {
    user_flag(std::string(kAdditionalArgs), value);
  }
  return plan;
}

}  // namespace

LaunchPlan PlanLaunch(const JsonView& container, const JsonView& additional_args_entry) {
  // Views into the pod's own strings: the launch script is a few KB and is only read.
  const std::vector<std::string_view> command = container["command"].Strings();
  std::vector<std::string_view> argv = command;
  for (std::string_view arg : container["args"].Strings()) argv.push_back(arg);
  const std::string_view additional_args = additional_args_entry["value"].String();
  const bool additional_args_from_ref = additional_args_entry.Contains("valueFrom");

  // The pods of one workload share their launch, and splitting and scanning a KServe script of
  // a few KB was a sixth of their admission: each thread keeps its last plan with everything
  // PlanArgv read, compared in place (a hit copies nothing).
  struct Last {
    std::vector<std::string> argv;
    size_t command_size = 0;
    std::string additional_args;
    bool additional_args_from_ref = false;
    LaunchPlan plan;
  };
  thread_local std::optional<Last> last;
  if (!last || last->command_size != command.size() ||
      last->additional_args_from_ref != additional_args_from_ref ||
      last->additional_args != additional_args ||
      !std::equal(argv.begin(), argv.end(), last->argv.begin(), last->argv.end())) {
    last = Last{std::vector<std::string>(argv.begin(), argv.end()), command.size(),
                std::string(additional_args), additional_args_from_ref,
                PlanArgv(argv, command.size(), additional_args, additional_args_from_ref)};
  }
  return last->plan;
}

}  // namespace kvoffload::webhook
