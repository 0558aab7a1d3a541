// The real binary's offline commands, as a GitOps CI step runs them: `validate -f FILE|DIR|-`
// reports every error of every document on stderr and exits 1 when any is invalid, 0 otherwise;
// `inject` refuses the same input with every error and prints warnings on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_pki.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class CliTest : public ::testing::Test {
 protected:
  // Runs the binary with `args` (shell words), stdin from `stdin_file` when given.
  CommandResult Webhook(const std::string& args, const fs::path& stdin_file = {}) {
    const fs::path out = dir_ / "out", err = dir_ / "err";
    std::string cmd = std::string("'") + KVOFFLOAD_WEBHOOK_BINARY + "' " + args + " >'" +
                      out.string() + "' 2>'" + err.string() + "'";
    if (!stdin_file.empty()) cmd += " <'" + stdin_file.string() + "'";
    const int status = std::system(cmd.c_str());
    CommandResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }
  fs::path Write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  static std::string Seed() { return Slurp(KVOFFLOAD_EXAMPLES "/llminferenceservice.yaml"); }
  static std::string Broken() {
    std::string text = Seed();
    text.replace(text.find("cpu: \"10Gi\""), 11, "cpu: \"ten\"");
    text.replace(text.find("evictionPolicy: lru"), 19, "evictionPolicy: fifo");
    return text;
  }

  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_ = testing::TempDir("cli");
};

TEST_F(CliTest, ValidateAcceptsTheSeedExample) {
  CommandResult r = Webhook(std::string("validate -f '") + KVOFFLOAD_EXAMPLES "/llminferenceservice.yaml'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 object(s) with a kvCacheOffloading spec checked, 0 invalid\n");
  EXPECT_EQ(r.err.find("Error:"), std::string::npos) << r.err;
}

TEST_F(CliTest, ValidateReportsEveryErrorFromStdinAndExitsOne) {
  CommandResult r = Webhook("validate -f -", Write("broken.yaml", Broken()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Error: LLMInferenceService default/qwen3: spec.kvCacheOffloading.cpu: "
                       "\"ten\" is not a valid quantity"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Error: LLMInferenceService default/qwen3: "
                       "spec.kvCacheOffloading.evictionPolicy: \"fifo\" is not supported"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "1 object(s) with a kvCacheOffloading spec checked, 1 invalid\n");
}

TEST_F(CliTest, ValidateMultiDocumentFileNamesEachDocument) {
  const fs::path file = Write("all.yaml", Broken() + R"(---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team-a}
spec:
  replicas: 0
  template:
    metadata: {annotations: {kvoffload.io/config: '{"cpu":"1Gi","secondary":[{}]}'}}
    spec: {containers: [{name: main, image: vllm}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b, annotations: {kvoffload.io/default-config: '{"cpu":"1Gi"}'}}
)");
  CommandResult r = Webhook("validate --filename '" + file.string() + "' --namespace ml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Error: LLMInferenceService ml/qwen3: spec.kvCacheOffloading.cpu"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Error: Deployment team-a/web: spec.template: kvCacheOffloading from pod "
                       "annotation kvoffload.io/config is invalid: kvCacheOffloading.secondary[0]"
                       ".fileSystem: only fileSystem tiers are supported"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("Namespace team-b"), std::string::npos) << r.err;  // valid
  EXPECT_EQ(r.out, "3 object(s) with a kvCacheOffloading spec checked, 2 invalid\n");
}

TEST_F(CliTest, InjectRefusesWithEveryErrorAndWarnsOnStderr) {
  CommandResult bad = Webhook("inject -f -", Write("broken.yaml", Broken()));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find("Error: LLMInferenceService default/qwen3: spec.kvCacheOffloading.cpu"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("\nError: LLMInferenceService default/qwen3: "
                         "spec.kvCacheOffloading.evictionPolicy"),
            std::string::npos)
      << bad.err;

  CommandResult good = Webhook("inject -f -", Write("seed.yaml", Seed()));
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_NE(good.err.find("Warning: LLMInferenceService default/qwen3: PVC my-kv-cache-pvc was "
                          "not checked"),
            std::string::npos)
      << good.err;
  EXPECT_NE(good.out.find("kind: LLMInferenceService"), std::string::npos);
}

// As `kubectl apply -f DIR`: the directory's manifests are one input (a Namespace in one file
// gives the default spec of a Deployment in another), other files and subdirectories are not
// read, and each error names the file its object came from.
TEST_F(CliTest, DirectoryIsReadAsOneInput) {
  fs::create_directories(dir_ / "m" / "sub");
  Write("m/a-ns.yaml", R"(apiVersion: v1
kind: Namespace
metadata:
  name: team-b
  labels: {kvoffload.io/injection: enabled}
  annotations: {kvoffload.io/default-config: '{"cpu":"1Gi"}'}
)");
  Write("m/b-web.json", R"({"apiVersion": "apps/v1", "kind": "Deployment",
 "metadata": {"name": "web", "namespace": "team-b"},
 "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "vllm"}]}}}})");
  Write("m/README.md", "not a manifest: [\n");
  Write("m/sub/broken.yaml", Broken());

  CommandResult injected = Webhook("inject -f '" + (dir_ / "m").string() + "'");
  EXPECT_EQ(injected.exit_code, 0) << injected.err;
  // Both files' documents, in name order, as one YAML stream; the Deployment injected from the
  // other file's Namespace.
  const size_t ns = injected.out.find("kind: Namespace");
  const size_t web = injected.out.find("kind: Deployment");
  ASSERT_NE(ns, std::string::npos) << injected.out;
  ASSERT_NE(web, std::string::npos) << injected.out;
  EXPECT_LT(ns, web);
  EXPECT_NE(injected.out.find("---\n"), std::string::npos);
  EXPECT_NE(injected.out.find("KVOFFLOAD_CPU_BYTES"), std::string::npos) << injected.out;
  EXPECT_NE(injected.out.find("namespace team-b annotation kvoffload.io/default-config"),
            std::string::npos)
      << injected.out;

  Write("m/c-broken.yml", Broken());
  CommandResult checked = Webhook("validate -f '" + (dir_ / "m").string() + "'");
  EXPECT_EQ(checked.exit_code, 1);
  EXPECT_NE(checked.err.find("Error: " + (dir_ / "m" / "c-broken.yml").string() +
                             ": LLMInferenceService default/qwen3: spec.kvCacheOffloading.cpu"),
            std::string::npos)
      << checked.err;
  EXPECT_EQ(checked.out, "3 object(s) with a kvCacheOffloading spec checked, 1 invalid\n");

  Write("m/d-unparsable.yaml", "a: [\n");
  CommandResult unparsable = Webhook("validate -f '" + (dir_ / "m").string() + "'");
  EXPECT_EQ(unparsable.exit_code, 1);
  EXPECT_NE(unparsable.err.find("Error: " + (dir_ / "m" / "d-unparsable.yaml").string() +
                                ": input is not valid YAML"),
            std::string::npos)
      << unparsable.err;
}

// A path that is not there, and a directory with nothing to read, are errors naming the path:
// ifstream opens a directory and reads nothing, which once gave "0 object(s) checked" and exit 0.
TEST_F(CliTest, UnreadableInputNamesThePath) {
  CommandResult missing = Webhook("validate -f '" + (dir_ / "nope.yaml").string() + "'");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "kv-offload-webhook: -f " + (dir_ / "nope.yaml").string() +
                             ": cannot read: No such file or directory\n");
  fs::create_directories(dir_ / "empty");
  Write("empty/notes.txt", "kind: Pod\n");
  CommandResult empty = Webhook("inject -f '" + (dir_ / "empty").string() + "'");
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_EQ(empty.out, "");
  EXPECT_EQ(empty.err, "kv-offload-webhook: -f " + (dir_ / "empty").string() +
                           ": the directory has no .yaml, .yml or .json file\n");
  CommandResult config = Webhook("validate -f - --config=@'" + (dir_ / "empty").string() + "'",
                                 Write("seed.yaml", Seed()));
  EXPECT_EQ(config.exit_code, 1);
  EXPECT_EQ(config.err, "kv-offload-webhook: --config: " + (dir_ / "empty").string() +
                            ": is a directory, not a file\n");
}

// Documents without a namespace get --namespace's: a name no API server would take is a flag
// error, not something written into every such document.
TEST_F(CliTest, NamespaceFlagMustBeANamespaceName) {
  const std::vector<std::string> bad = {"", "Team_A", "a.b", std::string(64, 'a')};
  for (const std::string& value : bad) {
    CommandResult r =
        Webhook("inject -f - --namespace='" + value + "'", Write("seed.yaml", Seed()));
    EXPECT_EQ(r.exit_code, 1) << value;
    EXPECT_EQ(r.out, "") << value;
    EXPECT_NE(r.err.find("--namespace=" + value + " is not a namespace name"), std::string::npos)
        << r.err;
  }
  CommandResult ok = Webhook("validate -f - --namespace=team-a", Write("seed.yaml", Seed()));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("LLMInferenceService team-a/qwen3"), std::string::npos) << ok.err;
}

// Every -f is read, as kubectl reads several: only the last one was, so `validate -f bad -f
// good` passed. Any other flag given twice, and an empty --config, are refused.
TEST_F(CliTest, EveryFileFlagIsReadAndOtherFlagsOnce) {
  const fs::path bad = Write("bad.yaml", Broken()), good = Write("good.yaml", Seed());
  CommandResult both = Webhook("validate -f '" + bad.string() + "' -f '" + good.string() + "'");
  EXPECT_EQ(both.exit_code, 1) << both.err;
  EXPECT_EQ(both.out, "2 object(s) with a kvCacheOffloading spec checked, 1 invalid\n");
  EXPECT_NE(both.err.find("Error: " + bad.string() + ": LLMInferenceService default/qwen3"),
            std::string::npos)
      << both.err;
  CommandResult injected = Webhook("inject -f '" + good.string() + "' --filename='" +
                                   good.string() + "'");
  EXPECT_EQ(injected.exit_code, 0) << injected.err;
  size_t copies = 0;
  for (size_t at = 0; (at = injected.out.find("kind: LLMInferenceService", at)) != std::string::npos;
       ++at) {
    ++copies;
  }
  EXPECT_EQ(copies, 2u) << injected.out;

  CommandResult twice = Webhook("validate -f '" + good.string() + "' --namespace=a --namespace=b");
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_EQ(twice.err, "kv-offload-webhook: flag --namespace given twice (a and b); give it once\n");
  CommandResult empty = Webhook("inject -f '" + good.string() + "' --config=");
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.err.find("--config is empty"), std::string::npos) << empty.err;
  EXPECT_EQ(empty.out, "");
}

// What a GitOps step must not pass without a word. Each of these exited 0: stdin that is a
// directory (read as empty), an input with no object (what `kustomize build broken 2>/dev/null
// | inject -f -` gives), a link to nothing in an -f directory (passed over), output that could
// not be written (a full disk left the manifest empty), and a bad --config when every
// document had a spec of its own.
TEST_F(CliTest, WhatCannotBeReadOrWrittenFailsTheRun) {
  const fs::path seed = Write("seed.yaml", Seed());
  CommandResult dir_stdin = Webhook("validate -f -", dir_);
  EXPECT_EQ(dir_stdin.exit_code, 1);
  EXPECT_EQ(dir_stdin.err, "kv-offload-webhook: -f stdin: is a directory, not a file\n");

  for (const char* command : {"inject", "validate"}) {
    CommandResult empty = Webhook(std::string(command) + " -f -", Write("empty.yaml", "# none\n"));
    EXPECT_EQ(empty.exit_code, 1) << command;
    EXPECT_EQ(empty.out, "") << command;
    EXPECT_NE(empty.err.find("the input (stdin) holds no object"), std::string::npos)
        << empty.err;
  }

  fs::create_directories(dir_ / "linked");
  fs::copy_file(seed, dir_ / "linked" / "a.yaml");
  fs::create_symlink(dir_ / "missing.yaml", dir_ / "linked" / "b.yaml");
  CommandResult dangling = Webhook("inject -f '" + (dir_ / "linked").string() + "'");
  EXPECT_EQ(dangling.exit_code, 1);
  EXPECT_EQ(dangling.err, "kv-offload-webhook: -f " + (dir_ / "linked" / "b.yaml").string() +
                              ": cannot read: No such file or directory\n");

  for (const char* redirect : {">/dev/full", ">&-"}) {
    const std::string cmd = std::string("'") + KVOFFLOAD_WEBHOOK_BINARY + "' inject -f '" +
                            seed.string() + "' " + redirect + " 2>'" + (dir_ / "err").string() +
                            "'";
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << redirect;
    EXPECT_NE(Slurp(dir_ / "err").find("cannot write the output (stdout)"), std::string::npos)
        << redirect << ": " << Slurp(dir_ / "err");
  }

  // The seed has a spec of its own, so --config is never used; it is still checked.
  CommandResult config = Webhook("validate -f '" + seed.string() + "' --config='{\"cpuu\": \"1Gi\"}'");
  EXPECT_EQ(config.exit_code, 1);
  EXPECT_NE(config.err.find("kv-offload-webhook: --config: "), std::string::npos) << config.err;
  EXPECT_NE(config.err.find("cpuu"), std::string::npos) << config.err;
}

// A flag written without its value took the next flag as it: `--tls-cert-file --tls-key-file=k`
// then said both flags were missing.
TEST_F(CliTest, AFlagIsNeverAnotherFlagsValue) {
  CommandResult r = Webhook("serve --tls-cert-file --tls-key-file=key.pem");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "kv-offload-webhook: flag --tls-cert-file needs a value, and the next "
                   "argument --tls-key-file=key.pem is a flag; write --tls-cert-file=VALUE\n");
  CommandResult spaced = Webhook("validate -f '" + Write("seed.yaml", Seed()).string() +
                                 "' --namespace team-a");
  EXPECT_EQ(spaced.exit_code, 0) << spaced.err;
}

TEST_F(CliTest, ValidateWithoutInputIsAUsageError) {
  CommandResult r = Webhook("validate");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("validate needs -f FILE"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvoffload::webhook
