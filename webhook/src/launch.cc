#include "webhook/launch.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>
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
// nullopt when the shell runs a script file instead. `-o NAME` and bash's `-O NAME` take the
// next word, also bundled (`-euo pipefail`, which once hid the `-c`: the script was read as
// `pipefail`'s and our flag became the shell's $0); bash's long options are no `-c`
// (`--norc`, `--rcfile FILE` and `--init-file FILE` with theirs).
std::optional<size_t> ShellCommandOption(const std::vector<std::string_view>& argv,
                                         size_t shell) {
  for (size_t i = shell + 1; i < argv.size(); ++i) {
    const std::string_view a = argv[i];
    if (a == "--rcfile" || a == "--init-file") {
      ++i;
      continue;
    }
    if (a.size() < 2 || (a[0] != '-' && a[0] != '+') || a == "--") return std::nullopt;
    if (a.starts_with("--")) continue;
    if (a.find('c') != std::string_view::npos) return i;
    i += static_cast<size_t>(std::count_if(a.begin() + 1, a.end(),
                                           [](char c) { return c == 'o' || c == 'O'; }));
  }
  return std::nullopt;
}

// Whether `argv[program]` starts vLLM itself rather than a wrapper around a shell.
bool StartsVllm(std::string_view program) {
  const std::string_view base = BaseName(program);
  return base == "vllm" || base.starts_with("python");
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

// Finds a flag in a list of arguments: `--kv-transfer-config X` or `--kv-transfer-config=X`,
// or vLLM's dotted form, one key each (`--kv-transfer-config.kv_connector=X`), gathered into
// the object vLLM builds from them (values that are JSON as JSON, the rest as strings): ours
// next to those was merged with the user's by vLLM.
// `parsed_by_shell`: the arguments reach vLLM through eval, which removes a layer of quoting.
bool FindFlagInArgs(const std::vector<std::string_view>& args, bool parsed_by_shell,
                    std::string* value, bool* dotted_form = nullptr) {
  nlohmann::json dotted;
  for (size_t i = 0; i < args.size(); ++i) {
    for (std::string_view flag : kFlagNames) {
      const std::string_view a = args[i];
      if (!a.starts_with(flag)) continue;
      std::string_view raw;
      const bool with_equals = a.size() > flag.size() && a.find('=') != std::string_view::npos;
      if (a.size() == flag.size() || (a[flag.size()] == '.' && !with_equals)) {
        raw = i + 1 < args.size() ? args[i + 1] : std::string_view();
      } else if (a[flag.size()] == '=' || a[flag.size()] == '.') {
        raw = a.substr(a.find('=') + 1);
      } else {
        continue;
      }
      std::string text = parsed_by_shell ? UnquoteWord(raw) : std::string(raw);
      if (a.size() == flag.size() || a[flag.size()] == '=') {
        *value = std::move(text);
        return true;
      }
      const std::string_view path =
          a.substr(flag.size() + 1, (with_equals ? a.find('=') : a.size()) - flag.size() - 1);
      nlohmann::json* at = &dotted;
      for (size_t from = 0; from <= path.size();) {
        const size_t dot = std::min(path.find('.', from), path.size());
        // A key under one given a value before (`.a=X` then `.a.b=1`): an object from here
        // on. Whichever vLLM keeps, the flag is the user's; indexing the string threw, and the
        // admission answered 500.
        if (!at->is_null() && !at->is_object()) *at = nlohmann::json::object();
        at = &(*at)[std::string(path.substr(from, dot - from))];
        from = dot + 1;
      }
      *at = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (at->is_discarded()) *at = text;
    }
  }
  if (dotted.is_null()) return false;
  *value = dotted.dump();
  if (dotted_form != nullptr) *dotted_form = true;
  return true;
}

// Whether the flag at `pos` is a glob pattern's (`*--kv-transfer-config*`,
// `*"--kv-transfer-config"*`): a test of what was passed, not a flag.
bool IsGlobAt(std::string_view text, size_t pos) {
  return (pos >= 1 && text[pos - 1] == '*') ||
         (pos >= 2 && text[pos - 1] == '"' && text[pos - 2] == '*');
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
      if (IsGlobAt(text, pos)) {
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

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// A script's logical lines: backslash-newline continuations joined (inside double quotes too,
// where KServe's `eval "exec vllm serve \` spans many lines), a quoted string's newlines kept
// on its line, comments dropped (whole lines, and from a word starting with # to the end of
// its line: a trailing comment naming the flag was taken for the user's own). A here-document's
// body is left out: it is data for the command it feeds (python3 - <<EOF, cat >&2 <<EOF), whose
// "$@" or --kv-transfer-config was taken for the launch's, and an apostrophe in it quoted the
// rest of the script.
std::vector<std::string> LogicalLines(std::string_view script) {
  std::vector<std::string> kept;
  std::string cur;
  auto keep = [&kept](std::string& line) {
    if (line.find_first_not_of(" \t") != std::string::npos) kept.push_back(std::move(line));
    line.clear();
  };
  std::vector<std::string> heredoc_ends;  // delimiters of the here-documents opened on `cur`
  char quote = 0;
  for (size_t i = 0; i < script.size(); ++i) {
    const char c = script[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0;
      cur += c == '\n' ? ' ' : c;
    } else if (c == '\\' && i + 1 < script.size()) {
      if (script[i + 1] == '\n') {
        cur += ' ';
      } else {
        cur += c;
        cur += script[i + 1];
      }
      ++i;
    } else if (quote == '"') {
      if (c == '"') quote = 0;
      cur += c == '\n' ? ' ' : c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      cur += c;
    } else if (c == '#' && (cur.empty() || std::string_view(" \t;&|()").find(cur.back()) !=
                                               std::string_view::npos)) {
      const size_t nl = script.find('\n', i);
      i = (nl == std::string_view::npos ? script.size() : nl) - 1;
    } else if (c == '<' && i + 2 < script.size() && script[i + 1] == '<' &&
               script[i + 2] != '<') {
      // `<<WORD`, `<<-WORD`, `<< 'WORD'`: the body ends at a line that is WORD alone.
      size_t w = i + 2;
      if (script[w] == '-') ++w;
      while (w < script.size() && (script[w] == ' ' || script[w] == '\t')) ++w;
      std::string word;
      for (; w < script.size() && std::string_view(" \t\n;&|<>()").find(script[w]) ==
                                      std::string_view::npos;
           ++w) {
        if (script[w] != '\'' && script[w] != '"' && script[w] != '\\') word += script[w];
      }
      // A delimiter is a word (EOF, 'PY'); `$((x<<2))` is a shift, not a here-document, whose
      // "body" would have swallowed the rest of the script.
      if (!word.empty() && (IsWordChar(word[0]) && !(word[0] >= '0' && word[0] <= '9'))) {
        heredoc_ends.push_back(std::move(word));
      }
      cur.append(script.substr(i, w - i));
      i = w - 1;
    } else if (c == '\n') {
      keep(cur);
      for (const std::string& end : heredoc_ends) {
        // Past the body, up to its delimiter (leading tabs allowed, as <<- strips).
        while (i + 1 < script.size()) {
          const size_t from = i + 1;
          const size_t nl = std::min(script.find('\n', from), script.size());
          std::string_view body_line = script.substr(from, nl - from);
          i = nl;
          if (body_line.substr(std::min(body_line.find_first_not_of('\t'), body_line.size())) ==
              end) {
            break;
          }
        }
      }
      heredoc_ends.clear();
    } else {
      cur += c;
    }
  }
  keep(cur);
  return kept;
}

// The words of the simple command around `pos`: from the last separator (; && || | and the
// keywords that start a command list) before it, at `floor` or after.
std::vector<std::string> CommandWordsBefore(std::string_view line, size_t pos,
                                            size_t floor = 0) {
  // Walks back from `pos` to the nearest end of a separator: one pass, where searching for each
  // separator separately read the line seven times for every match in a long eval line.
  // A brace group, a subshell or a command substitution starts a command too: the echo in
  // `log() { echo "$*" >&2; }` was taken for a launch of `log()`.
  static constexpr std::array<std::string_view, 10> kSeparators = {
      ";", "&&", "||", "|", " then ", " do ", " else ", "{ ", "( ", "$("};
  // A group closed before `pos` (`$(cat /etc/args) "$@"`, `${X}`) is passed over whole: its
  // `$(` was taken for the start of the command at `pos`, whose first word was then `cat`,
  // and a launch after a command substitution was read as no launch.
  size_t start = floor;
  int closed = 0;
  for (size_t end = pos; end > floor && start == floor; --end) {
    const char last = line[end - 1];
    if (last == ')' || last == '}') {
      ++closed;
      continue;
    }
    if (closed > 0) {
      if (last == '(' || last == '{') --closed;
      continue;
    }
    if (last != ';' && last != '&' && last != '|' && last != ' ' && last != '(') continue;
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

// The quote `pos` of a logical line stands in: 0 (none), '\'' or '"', and where it opens.
struct Quote {
  char mark = 0;
  size_t start = 0;
};
Quote QuoteAt(std::string_view line, size_t pos) {
  Quote q;
  for (size_t i = 0; i < pos; ++i) {
    const char c = line[i];
    if (q.mark == '\'') {
      if (c == '\'') q.mark = 0;
    } else if (c == '\\') {
      ++i;
    } else if (c == q.mark) {
      q.mark = 0;
    } else if (q.mark == 0 && (c == '\'' || c == '"')) {
      q = {c, i};
    }
  }
  return q;
}

// Where the shell word that `from` is in ends (an unquoted blank or operator), `quote` being
// the quote `from` stands in (0, '\'' or '"').
size_t WordEnd(std::string_view line, size_t from, char quote) {
  for (size_t i = from; i < line.size(); ++i) {
    const char c = line[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0;
    } else if (c == '\\') {
      ++i;
    } else if (quote == '"') {
      if (c == '"') quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == ';' || c == '&' || c == '|' ||
               c == '<' || c == '>' || c == '(' || c == ')') {
      return i;
    }
  }
  return line.size();
}

// How many compound commands and brace groups `line` opens less how many it closes: `if`,
// `case`, `do` and `{` against `fi`, `esac`, `done` and `}`, as words outside quotes.
int BlockDepthChange(std::string_view line) {
  static constexpr std::array<std::string_view, 4> kOpen = {"if", "case", "do", "{"};
  static constexpr std::array<std::string_view, 4> kClose = {"fi", "esac", "done", "}"};
  int change = 0;
  std::string word;
  auto end_word = [&] {
    if (std::find(kOpen.begin(), kOpen.end(), word) != kOpen.end()) ++change;
    if (std::find(kClose.begin(), kClose.end(), word) != kClose.end()) --change;
    word.clear();
  };
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0;
      word += c;
    } else if (c == '\\') {
      word += c;
      if (i + 1 < line.size()) word += line[++i];
    } else if (quote != 0) {
      if (c == quote) quote = 0;
      word += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      word += c;
    } else if (c == ' ' || c == '\t' || c == ';' || c == '&' || c == '|' || c == '(' ||
               c == ')') {
      end_word();
    } else {
      word += c;
    }
  }
  end_word();
  return change;
}

// The most occurrences of the flag (or of `vllm serve`) a script is read for: each walks its
// line for the command around it, so a hostile script is read no further.
constexpr size_t kMaxFlagsRead = 64;

// FindFlagInText over a script's logical lines, without its comments and the commands that
// only print or test text (a comment or an echo that names the flag passed vLLM nothing, and
// once made the webhook leave the pod without one). Assignments stay: a flag kept in a
// variable is likely expanded into the launch later.
// A test of the arguments (`[[ "$*" != *"--kv-transfer-config"* ]]`, `case "$*" in
// *--kv-transfer-config*)`) makes the script's own flag a default for when nobody passed one,
// as KServe's templates do: the flag inside the block the test opens, or on its line, and any
// before it (kept in a variable the block may use). One after the last test's block has
// closed is passed whatever the arguments hold: the user's (2026-12-07: a `case "$*"` that
// only logged, then `KV=--kv-transfer-config=...` and `vllm serve $KV "$@"`, gave vLLM two
// flags, ours last and winning, where the status said args).
bool FindFlagInScript(const std::vector<std::string>& lines, std::string* value) {
  static constexpr std::array<std::string_view, 3> kPrints = {"echo", "printf", ":"};
  struct Flag {
    size_t line = 0;
    std::string value;
  };
  std::vector<Flag> flags;
  std::vector<int> depth_after(lines.size());
  size_t last_test = lines.size();
  int depth = 0;
  size_t read = 0;  // kMaxFlagsRead
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    bool test = false;
    bool found = false;
    for (std::string_view flag : kFlagNames) {
      // Every occurrence on the line, not only its first: a print of the flag before the
      // launch (`echo "passing --kv-transfer-config"; exec vllm serve ... --kv-transfer-config
      // ...`) hid the launch's own, and vLLM got two.
      for (size_t at = line.find(flag); at != std::string::npos; at = line.find(flag, at + 1)) {
        if (IsGlobAt(line, at)) {
          test = true;
          continue;
        }
        if (found || read >= kMaxFlagsRead) continue;
        ++read;
        const std::vector<std::string> words = CommandWordsBefore(line, at);
        if (!words.empty() &&
            std::find(kPrints.begin(), kPrints.end(), words.front()) != kPrints.end()) {
          continue;
        }
        std::string v = FlagValueAt(line, at, flag.size());
        // Inside a quoted string (`KV='--kv-transfer-config={"a":1}'`): the value is what the
        // string holds from the flag on, split at blanks as its unquoted expansion is. Read
        // as a word of its own, the string's closing quote opened a new one, and a valid flag
        // was reported as invalid JSON; so was one followed on its line by more (`'; exec`).
        if (const Quote q = QuoteAt(line, at); q.mark != 0) {
          const std::string held = UnquoteWord(
              std::string(1, q.mark) + line.substr(at, WordEnd(line, at, q.mark) - at));
          v = FlagValueAt(held, 0, flag.size(), /*split_only=*/true);
        }
        flags.push_back({i, std::move(v)});
        found = true;
      }
    }
    if (test) last_test = i;
    depth = std::max(0, depth + BlockDepthChange(lines[i]));
    depth_after[i] = depth;
  }
  // Where the last test's block closes: the first line after which the depth is back at (or
  // below) the depth before the test's line.
  size_t block_end = last_test;
  if (last_test < lines.size()) {
    const int before = last_test == 0 ? 0 : depth_after[last_test - 1];
    while (block_end < lines.size() && depth_after[block_end] > before) ++block_end;
  }
  for (Flag& flag : flags) {
    if (last_test < lines.size() && flag.line <= block_end) continue;
    *value = std::move(flag.value);
    return true;
  }
  return false;
}

// Whether the command `words` parses its quoted argument as shell text again: eval, or a
// shell's `-c` script (`exec bash -c "vllm serve $*"`), whose expansions of our flag then lose
// a layer of quoting.
bool ReparsesArgument(const std::vector<std::string>& words) {
  if (HasWord(words, "eval")) return true;
  if (words.size() < 2) return false;
  std::vector<std::string_view> argv(words.begin(), words.end());
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (IsShell(argv[i])) {
      const std::optional<size_t> c = ShellCommandOption(argv, i);
      return c && *c == argv.size() - 1;
    }
  }
  return false;
}

// Each expansion is read by walking its line back from it (its quote, its command's words),
// so a line of `echo $@$@$@...` took time quadratic in its length: 35 s for a 97 KiB script,
// a webhook thread held by one pod. A launch script expands its arguments a few times; past
// this many, the rest are not read (the script is taken to hand vLLM nothing).
constexpr size_t kMaxExpansionsRead = 64;

// How a script expands its own arguments, and VLLM_ADDITIONAL_ARGS.
constexpr std::array<std::string_view, 4> kArgumentExpansions = {"$@", "${@}", "$*", "${*}"};
constexpr std::array<std::string_view, 2> kAdditionalArgsExpansions = {
    "$VLLM_ADDITIONAL_ARGS", "${VLLM_ADDITIONAL_ARGS"};

struct Expansion {
  bool found = false;
  bool for_eval = false;  // expanded, then parsed again by eval or a nested shell
  bool one_word = false;  // expanded in double quotes, not parsed again: one word to vLLM
};

// Finds where the script launches something with one of `patterns` expanded, and whether eval
// (or a nested `sh -c`) parses that expansion a second time. An escaped `\$@` inside an eval
// string is expanded by eval itself, once, so it needs no extra quoting, as one in an eval's
// single-quoted string; other single-quoted text is not expanded here at all.
Expansion FindLaunchExpansion(const std::vector<std::string>& lines,
                              std::span<const std::string_view> patterns) {
  size_t examined = 0;
  for (const std::string& line : lines) {
    for (std::string_view p : patterns) {
      for (size_t pos = line.find(p); pos != std::string::npos; pos = line.find(p, pos + 1)) {
        // $VAR must not be the prefix of a longer name ($VLLM_ADDITIONAL_ARGS_X).
        const size_t end = pos + p.size();
        if (p.back() != '}' && p.back() != '@' && p.back() != '*' && end < line.size() &&
            IsWordChar(line[end])) {
          continue;
        }
        if (++examined > kMaxExpansionsRead) return {};
        const Quote q = QuoteAt(line, pos);
        if (q.mark == '\'') {
          // Not expanded by this shell; eval expands it once as it parses the string (our
          // flag needs no extra quoting then). A nested `sh -c '...'` has positional
          // parameters of its own: what this shell passes it comes later on the line.
          if (HasWord(CommandWordsBefore(line, q.start), "eval") &&
              IsLaunch(CommandWordsBefore(line, pos, q.start + 1))) {
            return {true, false, false};
          }
          continue;
        }
        const bool escaped = pos > 0 && line[pos - 1] == '\\';
        if (q.mark == '"') {
          // The command the quoted string belongs to, and, where that command parses the
          // string again (eval "cd /x; exec vllm serve $@"), the one inside it.
          const std::vector<std::string> outer = CommandWordsBefore(line, q.start);
          if (ReparsesArgument(outer)) {
            if (!IsLaunch(CommandWordsBefore(line, pos, q.start + 1))) continue;
            return {true, !escaped, false};
          }
          if (!IsLaunch(outer)) continue;
          return {true, false, true};
        }
        const std::vector<std::string> words = CommandWordsBefore(line, pos);
        if (!IsLaunch(words)) continue;
        return {true, !escaped && HasWord(words, "eval"), false};
      }
    }
  }
  return {};
}

// A line that starts vLLM (`vllm serve`, `-m vllm.entrypoints...`): the words outside quotes,
// or in a string that eval or a shell runs. Inside another command's string it is text (`log
// "starting vllm serve with $*"`), and taken for the launch, the log's "$*" sent our flag
// unquoted into the eval that followed: vLLM got it in pieces and did not start.
bool IsLaunchLine(std::string_view line) {
  static constexpr std::array<std::string_view, 2> kLaunches = {"vllm serve", "vllm.entrypoints"};
  size_t read = 0;  // kMaxFlagsRead
  for (std::string_view launch : kLaunches) {
    for (size_t pos = line.find(launch); pos != std::string_view::npos && read < kMaxFlagsRead;
         pos = line.find(launch, pos + 1), ++read) {
      const Quote q = QuoteAt(line, pos);
      if (q.mark == 0 || ReparsesArgument(CommandWordsBefore(line, q.start))) return true;
    }
  }
  return false;
}

// One pass over a script: whether each byte is inside quotes, and the brace that closes each
// unquoted `{` (npos where none does). One pass, not a walk from the start for each of them: a
// pod's script is the pod author's, and a walk per candidate took seconds on a large one.
struct ScriptShape {
  std::vector<bool> quoted;
  std::vector<size_t> closing;  // by the offset of its `{`
};
ScriptShape Shape(std::string_view s) {
  ScriptShape shape{std::vector<bool>(s.size(), false),
                    std::vector<size_t>(s.size(), std::string_view::npos)};
  std::vector<size_t> open;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    shape.quoted[i] = quote != 0;
    if (quote == '\'') {
      if (c == '\'') quote = 0;
    } else if (c == '\\') {
      if (i + 1 < s.size()) shape.quoted[i + 1] = quote != 0;
      ++i;
    } else if (quote == '"') {
      if (c == '"') quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '{') {
      open.push_back(i);
    } else if (c == '}' && !open.empty()) {
      shape.closing[open.back()] = i;
      open.pop_back();
    }
  }
  return shape;
}

bool StartsCommandAfter(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == ';' || c == '&' || c == '|' || c == '(' ||
         c == '{';
}

// A function the script defines: its name and the offsets of its body's braces in `text`.
struct Function {
  std::string_view name;
  size_t open = 0;
  size_t close = 0;
};

// The functions defined in `text` (a script's logical lines joined by newlines), in the forms
// scripts write: `name() {`, `name () {`, `function name() {` and `function name {`; in the
// order of their bodies.
std::vector<Function> Functions(std::string_view text) {
  const ScriptShape shape = Shape(text);
  std::vector<Function> out;
  auto add = [&](std::string_view name, size_t after_name) {
    size_t i = after_name;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    if (text.substr(i, 2) == "()") i += 2;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n')) ++i;
    if (i >= text.size() || text[i] != '{') return;
    if (shape.quoted[i] || shape.closing[i] == std::string_view::npos) return;
    out.push_back({name, i, shape.closing[i]});
  };
  auto name_ending_at = [&](size_t end) {
    size_t begin = end;
    while (begin > 0 && (IsWordChar(text[begin - 1]) || text[begin - 1] == '-')) --begin;
    return begin;
  };
  for (size_t pos = text.find("()"); pos != std::string_view::npos;
       pos = text.find("()", pos + 2)) {
    size_t end = pos;
    while (end > 0 && (text[end - 1] == ' ' || text[end - 1] == '\t')) --end;
    const size_t begin = name_ending_at(end);
    if (begin == end || (begin > 0 && !StartsCommandAfter(text[begin - 1])) ||
        shape.quoted[begin]) {
      continue;
    }
    add(text.substr(begin, end - begin), pos);
  }
  for (size_t pos = text.find("function "); pos != std::string_view::npos;
       pos = text.find("function ", pos + 1)) {
    if ((pos > 0 && !StartsCommandAfter(text[pos - 1])) || shape.quoted[pos]) continue;
    size_t begin = pos + 9;
    while (begin < text.size() && text[begin] == ' ') ++begin;
    size_t end = begin;
    while (end < text.size() && (IsWordChar(text[end]) || text[end] == '-')) ++end;
    // `function name()` was found above.
    if (end == begin || text.substr(end, 2) == "()") continue;
    add(text.substr(begin, end - begin), end);
  }
  std::sort(out.begin(), out.end(),
            [](const Function& a, const Function& b) { return a.open < b.open; });
  return out;
}

// `lines` with the bodies of the functions that no call hands the script's own arguments
// blanked out (newlines kept): inside a function "$@" is its call's arguments, so a launch
// there that expands "$@" gets ours only where the script calls it as `name "$@"` (or "$*").
// Lines without a function come back as they are. `launcher`: the name of a blanked function
// that starts vLLM, for the warning.
std::vector<std::string> WithScriptLevelArguments(const std::vector<std::string>& lines,
                                                  std::string* launcher) {
  std::string text;
  for (const std::string& line : lines) (text += line) += '\n';
  // Past 64 KiB (a launch script is a few) the script is read as before, without this: its
  // shape takes eight bytes per byte of script.
  if (text.size() > 64 * 1024) return lines;
  const std::vector<Function> functions = Functions(text);
  if (functions.empty()) return lines;
  std::vector<size_t> starts;  // of each line in `text`
  for (size_t at = 0; const std::string& line : lines) {
    starts.push_back(at);
    at += line.size() + 1;
  }
  // Where the script calls a function with its own arguments: each expansion of them, by the
  // command word it belongs to (after `if`, `while`, `until` or `!`), the first and last offset.
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> forwarding;
  size_t examined = 0;
  for (std::string_view p : kArgumentExpansions) {
    for (size_t pos = text.find(p); pos != std::string::npos; pos = text.find(p, pos + 1)) {
      if (++examined > kMaxExpansionsRead) return lines;  // as FindLaunchExpansion
      const size_t line_start = *(std::upper_bound(starts.begin(), starts.end(), pos) - 1);
      const std::vector<std::string> words = CommandWordsBefore(text, pos, line_start);
      size_t first = 0;
      while (first < words.size() && (words[first] == "if" || words[first] == "while" ||
                                      words[first] == "until" || words[first] == "!")) {
        ++first;
      }
      if (first == words.size()) continue;
      auto [it, added] = forwarding.try_emplace(words[first], pos, pos);
      if (!added) it->second = {std::min(it->second.first, pos), std::max(it->second.second, pos)};
    }
  }
  auto forwarded_to = [&](const Function& f) {
    const auto it = forwarding.find(f.name);
    // A call outside the function's own body (inside it, "$@" is already the function's).
    return it != forwarding.end() && (it->second.first < f.open || it->second.second > f.close);
  };
  std::string own = text;
  size_t blank_until = 0;  // a function inside one already blanked is blank: each byte once
  for (const Function& f : functions) {
    if (f.close <= blank_until || forwarded_to(f)) continue;
    if (IsLaunchLine(std::string_view(text).substr(f.open, f.close - f.open))) {
      *launcher = f.name;
    }
    for (size_t i = std::max(f.open + 1, blank_until); i < f.close; ++i) {
      if (own[i] != '\n') own[i] = ' ';
    }
    blank_until = std::max(blank_until, f.close);
  }
  std::vector<std::string> out;
  out.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) out.push_back(own.substr(starts[i], lines[i].size()));
  return out;
}

// How many times `text` names the flag, in either spelling.
size_t CountFlags(std::string_view text) {
  size_t n = 0;
  for (std::string_view flag : kFlagNames) {
    for (size_t pos = text.find(flag); pos != std::string_view::npos; pos = text.find(flag, pos + 1)) {
      ++n;
    }
  }
  return n;
}

}  // namespace

std::string ShellUnquote(std::string_view word) { return UnquoteWord(word); }

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

// Env entries other than VLLM_ADDITIONAL_ARGS whose literal value holds the flag: (name, value).
using FlagEnv = std::vector<std::pair<std::string, std::string>>;

// Calls f(at, name) for each $NAME and ${NAME...} of `line` outside single quotes (where
// nothing is expanded), in one pass: the script is the pod author's, and asking QuoteAt about
// each of a mebibyte of `$A` is quadratic. f returns false to stop.
template <typename F>
void ForEachExpansion(std::string_view line, F f) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0;
    } else if (c == '\\') {
      ++i;
    } else if (c == '"' || c == '\'') {
      quote = quote == c ? 0 : quote == 0 ? c : quote;
    } else if (c == '$') {
      const size_t start = i + (i + 1 < line.size() && line[i + 1] == '{' ? 2 : 1);
      size_t end = start;
      while (end < line.size() && IsWordChar(line[end])) ++end;
      if (end == start || (line[start] >= '0' && line[start] <= '9')) continue;
      if (!f(i, line.substr(start, end - start))) return;
    }
  }
}

// The names a script expands and never sets itself (no NAME= in it), VLLM_ADDITIONAL_ARGS
// aside: the env entries a flag of the user's may come from. KServe's script sets every
// variable it expands but that one, so its pods read no env here (88 env entries read for the
// flag in each admission cost 40% more instructions).
std::vector<std::string> EnvExpandedBy(const std::vector<std::string>& lines) {
  std::vector<std::string> expanded;
  for (const std::string& line : lines) {
    ForEachExpansion(line, [&expanded](size_t, std::string_view name) {
      if (name != kAdditionalArgs &&
          std::find(expanded.begin(), expanded.end(), name) == expanded.end()) {
        // A handful in a real script; a hostile one is read no further than this.
        if (expanded.size() >= kMaxExpansionsRead) return false;
        expanded.emplace_back(name);
      }
      return true;
    });
  }
  if (expanded.empty()) return expanded;
  std::vector<bool> set(expanded.size());
  size_t values_read = 0;  // each walks its word: a hostile script is read no further
  for (const std::string& line : lines) {
    for (size_t eq = line.find('='); eq != std::string::npos; eq = line.find('=', eq + 1)) {
      size_t from = eq;
      while (from > 0 && IsWordChar(line[from - 1])) --from;
      const std::string_view name = std::string_view(line).substr(from, eq - from);
      const auto it = std::find(expanded.begin(), expanded.end(), name);
      if (it == expanded.end()) continue;
      // An assignment that reads the entry keeps what it holds (`X="${X:-} --enforce-eager"`,
      // the `set -u` idiom): counted as set, the entry was not read, and a flag in it was
      // missed while ours was added.
      bool reads_itself = false;
      if (++values_read > kMaxExpansionsRead) {
        set[static_cast<size_t>(it - expanded.begin())] = true;
        continue;
      }
      const std::string_view value =
          std::string_view(line).substr(eq + 1, WordEnd(line, eq + 1, 0) - eq - 1);
      ForEachExpansion(value, [&](size_t, std::string_view found) {
        reads_itself = found == name;
        return !reads_itself;
      });
      if (!reads_itself) set[static_cast<size_t>(it - expanded.begin())] = true;
    }
  }
  std::vector<std::string> unset;
  for (size_t i = 0; i < expanded.size(); ++i) {
    if (!set[i]) unset.push_back(std::move(expanded[i]));
  }
  return unset;
}

// `lines` with a flag put where each expands env entry `name`, at most kMaxExpansionsRead of
// them; whether there was one.
bool MarkExpansions(std::vector<std::string>* lines, std::string_view name) {
  static constexpr std::string_view kMark = "--kv-transfer-config=kvoffload-env";
  size_t marked = 0;
  for (std::string& line : *lines) {
    std::vector<std::pair<size_t, size_t>> spans;  // [at, end) of each expansion of `name`
    ForEachExpansion(line, [&](size_t at, std::string_view found) {
      if (found != name) return true;
      size_t end = static_cast<size_t>(found.data() - line.data()) + found.size();
      if (line[at + 1] == '{') {
        const size_t close = line.find('}', end);
        end = close == std::string::npos ? line.size() : close + 1;
      }
      spans.emplace_back(at, end);
      return ++marked < kMaxExpansionsRead;
    });
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      line.replace(it->first, it->second - it->first, kMark);
    }
    if (marked >= kMaxExpansionsRead) break;
  }
  return marked > 0;
}

// A flag in an env entry that the script expands (`exec vllm serve /m $EXTRA_ARGS "$@"` with
// EXTRA_ARGS=--kv-transfer-config=...) reaches vLLM: the user's, where ours was added and
// vLLM got two, ours last and winning. Each expansion is read as a flag where it stands, by
// FindFlagInScript's rules (prints skipped, a test of the arguments deferring). Sets the
// entry's name and the value vLLM gets (split at blanks, as an unquoted expansion is).
bool FindFlagInExpandedEnv(const std::vector<std::string>& lines, const FlagEnv& flag_env,
                           std::string* name, std::string* value) {
  for (const auto& [entry, text] : flag_env) {
    std::vector<std::string> marked = lines;
    std::string ignored;
    if (!MarkExpansions(&marked, entry) || !FindFlagInScript(marked, &ignored)) continue;
    bool defers = false;
    FindFlagInText(text, value, &defers, nullptr, /*split_only=*/true);
    *name = entry;
    return true;
  }
  return false;
}

// What PlanLaunch reads: the command and args as one argv (the first `command_size` elements
// are the command), VLLM_ADDITIONAL_ARGS as a literal value, and whether its value is out of
// sight (valueFrom, or envFrom with no entry of its own: then there is nothing we can append
// to, as an entry of ours would replace the ConfigMap's value and the user's arguments in it),
// the env entries with a flag of the user's that the script may expand (FindFlagInExpandedEnv),
// and, when asked, where to put the names the script expands (EnvExpandedBy).
LaunchPlan PlanArgv(const std::vector<std::string_view>& argv, size_t command_size,
                    std::string_view additional_args, bool additional_args_unseen,
                    const FlagEnv& flag_env, std::vector<std::string>* env_expanded = nullptr) {
  LaunchPlan plan;
  bool dotted = false;  // FindFlagInArgs': the user's flag was given key by key
  auto user_flag = [&plan, &dotted](std::string where, std::string value) {
    plan.user_flag_dotted = dotted;
    plan.has_user_flag = true;
    plan.user_flag_where = std::move(where);
    plan.user_flag_expanded = value.starts_with('$');
    plan.user_flag_value = std::move(value);
  };
  auto note_shutdown_timeout = [&plan](std::string_view text) {
    for (std::string_view flag : {"--shutdown-timeout", "--shutdown_timeout"}) {
      if (text.find(flag) != std::string_view::npos) plan.has_shutdown_timeout = true;
    }
  };

  std::optional<size_t> dash_c;
  if (size_t program = ProgramIndex(argv); command_size > 0 && program < argv.size()) {
    if (!IsShell(argv[program]) && !StartsVllm(argv[program])) {
      // A wrapper not known to ProgramIndex (taskset -c 0-7, numactl, gosu USER, stdbuf,
      // busybox) in front of a shell: the first shell with a -c script after it.
      for (size_t i = program + 1; i < argv.size(); ++i) {
        if (IsShell(argv[i]) && ShellCommandOption(argv, i)) {
          program = i;
          break;
        }
      }
    }
    if (IsShell(argv[program])) dash_c = ShellCommandOption(argv, program);
  }
  if (!dash_c) {
    // Exec form (or an image entrypoint, or a script file we cannot read): vLLM, or whatever
    // stands in front of it, gets our argument as written.
    // VLLM_ADDITIONAL_ARGS is not read here: vLLM itself never reads it, only scripts that
    // expand it do (a flag there was taken for the user's, and vLLM got none).
    for (std::string_view text : argv) note_shutdown_timeout(text);
    plan.route = FlagRoute::kArgs;
    std::string value;
    if (FindFlagInArgs(argv, /*parsed_by_shell=*/false, &value, &dotted)) {
      user_flag("args", value);
      for (std::string_view a : argv) plan.user_flags += CountFlags(a);
    }
    return plan;
  }

  // `sh -c -- SCRIPT`: the -- ends the options, the script follows.
  size_t script_at = *dash_c + 1;
  if (script_at < argv.size() && argv[script_at] == "--") ++script_at;
  if (script_at >= argv.size()) return plan;  // `sh -c` with no script: nothing runs vLLM
  const std::vector<std::string_view> positional(argv.begin() + static_cast<long>(script_at) + 1,
                                                 argv.end());
  plan.needs_arg0 = positional.empty();

  const std::vector<std::string> lines = LogicalLines(argv[script_at]);
  if (env_expanded != nullptr) *env_expanded = EnvExpandedBy(lines);
  // The expansions that reach vLLM are those of its launch line, where the script has one
  // (`vllm serve`, `-m vllm.entrypoints...`): a `log "$@"` before `eval "exec vllm serve ...
  // $@"` was taken for the launch, and our flag went unquoted to the eval. Elsewhere only
  // where that line expands neither (`exec "$@"` with vllm in the args, a function).
  std::vector<std::string> launch_lines;
  for (const std::string& line : lines) {
    if (IsLaunchLine(line)) launch_lines.push_back(line);
  }
  auto expansions = [](const std::vector<std::string>& where) {
    return std::pair{
        FindLaunchExpansion(where, kAdditionalArgsExpansions),
        FindLaunchExpansion(where, kArgumentExpansions)};
  };
  auto [v, e] = expansions(launch_lines);
  const bool on_launch_line = v.found || e.found;
  if (!on_launch_line) std::tie(v, e) = expansions(lines);
  // A launch in a function that the script calls without its own arguments (`start() { exec
  // vllm serve "$@"; }` then `start`): ours would go to arguments that never reach it (vLLM got
  // no flag while the status said args). Read again with such bodies blanked out.
  std::string launcher;  // that function
  if (e.found) {
    const std::vector<std::string> own = WithScriptLevelArguments(lines, &launcher);
    if (own != lines) {
      std::vector<std::string> own_launch_lines;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (IsLaunchLine(lines[i])) own_launch_lines.push_back(own[i]);
      }
      e = FindLaunchExpansion(on_launch_line ? own_launch_lines : own, kArgumentExpansions);
    }
  }
  // What reaches vLLM: the script without its comments (a "TODO: --shutdown-timeout" comment
  // once kept ours out), the arguments only where it forwards them, the variable only where
  // it expands it (a --shutdown-timeout in args the script drops kept ours out too).
  for (const std::string& line : lines) note_shutdown_timeout(line);
  if (e.found) {
    for (size_t i = 1; i < positional.size(); ++i) note_shutdown_timeout(positional[i]);  // $1...
  }
  if (v.found) note_shutdown_timeout(additional_args);
  plan.additional_args_unseen = v.found && additional_args_unseen;
  if (v.found && !v.one_word && !additional_args_unseen) {
    plan.additional_args_route =
        v.for_eval ? FlagRoute::kAdditionalArgsEnvForEval : FlagRoute::kAdditionalArgsEnv;
  }
  if (e.found) {
    plan.route = e.for_eval ? FlagRoute::kArgsForEval : FlagRoute::kArgs;
  } else if (!v.found && !launcher.empty()) {
    plan.unreachable_why = "calls " + launcher + ", whose vllm command takes \"$@\", without "
                           "the script's own arguments; call it as " + launcher + " \"$@\",";
  } else if (v.found && v.one_word) {
    plan.unreachable_why = "expands \"$VLLM_ADDITIONAL_ARGS\" in double quotes, which makes it "
                           "one word to vLLM, so a flag added to it would join the arguments "
                           "there; expand it unquoted, add \"$@\" to the vllm command,";
  } else if (v.found && additional_args_unseen) {
    plan.unreachable_why = "expands VLLM_ADDITIONAL_ARGS, set through valueFrom or envFrom, "
                           "which the webhook cannot read or add to; set it in env (an empty "
                           "value will do), add \"$@\" to the vllm command,";
  } else if (v.found) {
    plan.route =
        v.for_eval ? FlagRoute::kAdditionalArgsEnvForEval : FlagRoute::kAdditionalArgsEnv;
  }

  // A user's own flag: in the arguments the script forwards (positional[0] is $0), in the
  // script itself unless the script only uses its own when nobody passed one (KServe's
  // templates check $* first), or in VLLM_ADDITIONAL_ARGS where the script expands it: read
  // as eval reads it, or split at blanks as a plain expansion is.
  std::string value;
  bool defers = false;  // FindFlagInText's; a test in VLLM_ADDITIONAL_ARGS is no matter
  // Each place searched once: the flag vLLM may get from it, and how many in all (each flag in
  // args or VLLM_ADDITIONAL_ARGS once; the script's at most once: its tests of "$*" name the
  // flag without passing it).
  std::string script_value;
  const bool in_script =
      FindFlagInScript(launch_lines, &script_value) || FindFlagInScript(lines, &script_value);
  std::string env_name;
  std::string env_value;
  const bool in_expanded_env = FindFlagInExpandedEnv(lines, flag_env, &env_name, &env_value);
  if (e.found) {
    for (size_t i = 1; i < positional.size(); ++i) plan.user_flags += CountFlags(positional[i]);
  }
  if (v.found) plan.user_flags += CountFlags(additional_args);
  plan.user_flags += (in_script ? 1u : 0u) + (in_expanded_env ? 1u : 0u);
  if (e.found && positional.size() > 1 &&
      FindFlagInArgs(std::vector<std::string_view>(positional.begin() + 1, positional.end()),
                     plan.route == FlagRoute::kArgsForEval, &value, &dotted)) {
    user_flag("args", value);
  } else if (in_script) {
    // Written on the launch line itself, the flag always reaches vLLM, whatever the script
    // tests elsewhere (a `case "$*" in *--kv-transfer-config*` that only logs read as
    // deferring to the user's, and vLLM got two).
    user_flag("the launch script", script_value);
  } else if (v.found && FindFlagInText(additional_args, &value, &defers, nullptr,
                                       /*split_only=*/!v.for_eval)) {
    user_flag(std::string(kAdditionalArgs), value);
  } else if (in_expanded_env) {
    user_flag(env_name, env_value);
  }
  return plan;
}

}  // namespace

namespace {

// The literal values of the container's env entries by name (the last entry of a name, as the
// kubelet keeps it; nullopt where it is set through valueFrom). Built in one pass: a lookup per
// $(NAME) that walked the env array from its start (simdjson's at() does) held a webhook
// thread for minutes on a pod of 100,000 references and 2,000 entries.
using LiteralEnv = std::unordered_map<std::string_view, std::optional<std::string_view>>;
LiteralEnv LiteralEnvOf(const JsonView& env) {
  LiteralEnv out;
  for (const JsonView& entry : env.Elements()) {
    out[entry["name"].String()] =
        entry.Contains("value") ? std::optional(entry["value"].String()) : std::nullopt;
  }
  return out;
}

// Whether the kubelet may change `text`: a $$, or a $(NAME) where NAME looks like an env
// entry's name ([A-Za-z_][A-Za-z0-9_]*). Known without the env, so that a launch without
// either (KServe's: its $(...) are command substitutions) keeps its cached plan.
bool MayHoldKubeReference(std::string_view text) {
  for (size_t at = text.find('$'); at != std::string_view::npos && at + 1 < text.size();
       at = text.find('$', at + 1)) {
    if (text[at + 1] == '$') return true;
    if (text[at + 1] != '(') continue;
    // The name's characters, then its `)`: looking for the `)` first made each `$(` read to
    // the next one, quadratic in a run of `$(`.
    size_t end = at + 2;
    while (end < text.size() && IsWordChar(text[end])) ++end;
    if (end > at + 2 && end < text.size() && text[end] == ')' &&
        !(text[at + 2] >= '0' && text[at + 2] <= '9')) {
      return true;
    }
  }
  return false;
}

// `text` with the kubelet's expansion of command and args: $(NAME) of a literal env entry of
// the container is its value (the last entry of that name), $$ is $, anything else stays as
// written (an entry set through valueFrom or envFrom is not known here).
std::string ExpandKubeReferences(std::string_view text, const LiteralEnv& env) {
  // Each `$(` names what runs to the next `)`. That `)` is kept for the `$(`s before it, and a
  // name is looked up only when an entry has its length: finding the `)` and hashing the name
  // afresh for each `$(` was quadratic in a run of them.
  std::vector<bool> name_lengths;
  for (const auto& entry : env) {
    if (name_lengths.size() <= entry.first.size()) name_lengths.resize(entry.first.size() + 1);
    name_lengths[entry.first.size()] = true;
  }
  std::string out;
  size_t close = 0;  // the first `)` at or after where the last `$(` looked
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    if (text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (text[i + 1] == '(') {
      if (close != std::string_view::npos && close < i + 2) close = text.find(')', i + 2);
      if (close != std::string_view::npos) {
        const size_t length = close - i - 2;
        const auto it = length < name_lengths.size() && name_lengths[length]
                            ? env.find(text.substr(i + 2, length))
                            : env.end();
        if (it != env.end() && it->second) {
          out += *it->second;
          i = close;
          continue;
        }
      }
    }
    out += '$';
  }
  return out;
}

}  // namespace

LaunchPlan PlanLaunch(const JsonView& container, const JsonView& additional_args_entry) {
  // Views into the pod's own strings: the launch script is a few KB and is only read.
  const std::vector<std::string_view> command = container["command"].Strings();
  std::vector<std::string_view> argv = command;
  for (std::string_view arg : container["args"].Strings()) argv.push_back(arg);
  const std::string_view additional_args = additional_args_entry["value"].String();
  const bool additional_args_unseen =
      additional_args_entry.Contains("valueFrom") ||
      (additional_args_entry.IsNull() && container["envFrom"].Size() > 0);
  // The env entries among `names` whose literal value holds the flag.
  auto flag_env_of = [&container](const std::vector<std::string>& names) {
    FlagEnv flag_env;
    if (names.empty()) return flag_env;
    for (const JsonView& entry : container["env"].Elements()) {
      const std::string_view name = entry["name"].String();
      if (std::find(names.begin(), names.end(), name) == names.end()) continue;
      const std::string_view text = entry["value"].String();
      for (std::string_view flag : kFlagNames) {
        if (text.find(flag) != std::string_view::npos) {
          flag_env.emplace_back(name, text);
          break;
        }
      }
    }
    return flag_env;
  };

  // The pods of one workload share their launch, and splitting and scanning a KServe script of
  // a few KB was a sixth of their admission: each thread keeps its last plan with everything
  // PlanArgv read, compared in place (a hit copies nothing).
  struct Last {
    std::vector<std::string> argv;
    size_t command_size = 0;
    std::string additional_args;
    bool additional_args_unseen = false;
    std::vector<std::string> env_expanded;  // EnvExpandedBy the script
    bool references = false;  // holds what the kubelet may expand: planned from the env each time
    LaunchPlan plan;
  };
  thread_local std::optional<Last> last;
  if (!last || last->command_size != command.size() ||
      last->additional_args_unseen != additional_args_unseen ||
      last->additional_args != additional_args ||
      !std::equal(argv.begin(), argv.end(), last->argv.begin(), last->argv.end())) {
    const bool references = std::any_of(argv.begin(), argv.end(), MayHoldKubeReference);
    Last made{std::vector<std::string>(argv.begin(), argv.end()), command.size(),
              std::string(additional_args), additional_args_unseen, {}, references, {}};
    if (!references) {
      made.plan = PlanArgv(argv, command.size(), additional_args, additional_args_unseen, {},
                           &made.env_expanded);
    }
    last = std::move(made);  // only a finished plan: one that threw would be served next
  }
  if (!last->references) {
    // The plan holds for any env but one with a flag in an entry the script expands.
    const FlagEnv flag_env = flag_env_of(last->env_expanded);
    if (flag_env.empty()) return last->plan;
    return PlanArgv(argv, command.size(), additional_args, additional_args_unseen, flag_env);
  }
  // The kubelet expands $(NAME) in command and args before anything runs: a flag held in an
  // env entry and referenced in args was not seen, and vLLM got two. What it expands to
  // depends on the env, so this rare launch is planned afresh.
  const LiteralEnv env = LiteralEnvOf(container["env"]);
  std::vector<std::string> expanded;
  expanded.reserve(argv.size());
  for (std::string_view a : argv) expanded.push_back(ExpandKubeReferences(a, env));
  const std::vector<std::string_view> expanded_argv(expanded.begin(), expanded.end());
  std::vector<std::string> env_expanded;
  const LaunchPlan plan = PlanArgv(expanded_argv, command.size(), additional_args,
                                   additional_args_unseen, {}, &env_expanded);
  const FlagEnv flag_env = flag_env_of(env_expanded);
  if (flag_env.empty()) return plan;
  return PlanArgv(expanded_argv, command.size(), additional_args, additional_args_unseen,
                  flag_env);
}

}  // namespace kvoffload::webhook
