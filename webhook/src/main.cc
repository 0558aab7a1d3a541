// kv-offload-webhook: `serve` (default) runs the admission webhook; `inject` mutates manifests
// offline; `validate` checks manifests offline. Flags are --name=value or --name value.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvoffload/read_file.h"
#include "webhook/admission.h"
#include "webhook/caching_reader.h"
#include "webhook/inject.h"
#include "webhook/json_util.h"
#include "webhook/kube_client.h"
#include "webhook/log.h"
#include "webhook/metrics.h"
#include "webhook/server.h"
#include "webhook/spec.h"

namespace kvoffload::webhook {
namespace {

// The agent image built from this same tree (offload-agent/Dockerfile, make images): agent mode
// is the default, so it must work without flags; deployments pin their registry's copy.
constexpr char kDefaultAgentImage[] = "kv-offload/offload-agent:" KVOFFLOAD_VERSION;

constexpr char kUsage[] = R"(kv-offload-webhook: KV-cache offloading for vLLM pods on Kubernetes.

Usage:
  kv-offload-webhook [serve] [flags]     run the mutating admission webhook
  kv-offload-webhook inject -f PATH      print manifests with the offload tiers injected
  kv-offload-webhook validate -f PATH    check every kvCacheOffloading spec in the manifests
                                         (exit 1 when any is invalid; a CI step for GitOps)
  kv-offload-webhook version

serve flags:
  --port=8443                 HTTPS port (/mutate-pods, /validate, /validate-labelled,
                              /healthz, /readyz)
  --metrics-port=9090         plain HTTP port for /metrics (-1: off)
  --bind-address=0.0.0.0
  --tls-cert-file=FILE        serving certificate (PEM, chain allowed); re-read when it changes
  --tls-key-file=FILE         serving key (PEM)
  --client-ca-file=FILE       require client certificates signed by this CA
  --kubeconfig=FILE           API server access (default: in-cluster service account)
  --agent-image=IMAGE         image of the agent install step in mode agent
                              (default kv-offload/offload-agent:<this version>)
  --default-mode=agent        agent | vllm-native (pod annotation kvoffload.io/mode overrides)
  --log-format=text           text | json
  --log-level=info            debug | info | warn | error
  --shutdown-delay=5s         on SIGTERM, report not ready this long before closing
  --cert-reload-interval=1s   how often the certificate files are checked
  --kserve-namespace=kserve   KServe's own namespace: where the LLMInferenceServiceConfigs
                              that a service's spec.baseRefs names are looked for when not
                              in the service's namespace
  --lookup-timeout=2s         all API server lookups of one admission, together
                              (keep it below the webhooks' timeoutSeconds)
  --cache-ttl=10s             how long lookups are reused
  --threads=64                admissions handled at once (each may wait on lookups)
  --max-connections=4096      open HTTPS connections; more are closed on accept
  --request-timeout=10s       one request's headers and body, from its first byte
  --handshake-timeout=5s      accept to TLS established (these two: each connection gets
                              up to a tenth more, so that slow clients are not all cut at once)
  --idle-timeout=120s         wait for a connection's next request; keep it above the API
                              server's 90s, so that the API server closes idle connections

inject and validate flags:
  -f, --filename=FILE|DIR|-   input (YAML or JSON, several documents allowed); a directory:
                              its *.yaml, *.yml and *.json files; -f again for more, all
                              read as one input
  --namespace=default         namespace for documents without one
  --config=JSON|@FILE         spec to use when the input carries none
  --default-mode, --agent-image, --kserve-namespace   as for serve
)";

struct Flags {
  std::map<std::string, std::string> values;
  std::vector<std::string> filenames;  // every -f, in order, as kubectl takes several
  std::vector<std::string> positional;
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
};

Result<Flags> ParseFlags(int argc, char** argv, int start) {
  Flags flags;
  for (int i = start; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-f") arg = "--filename";
    if (arg.rfind("--", 0) != 0) {
      flags.positional.push_back(arg);
      continue;
    }
    arg = arg.substr(2);
    const size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq), value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (arg == "help") {
      value = "true";
    } else if (i + 1 < argc && std::string_view(argv[i + 1]).starts_with("--")) {
      // `--tls-cert-file --tls-key-file=key.pem` took the second flag as the first's value,
      // and then said both were missing.
      return Status::InvalidArgument("flag --" + arg + " needs a value, and the next argument " +
                                     argv[i + 1] + " is a flag; write --" + arg + "=VALUE");
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Status::InvalidArgument("flag --" + arg + " needs a value");
    }
    if (name == "filename") flags.filenames.push_back(value);
    // Any other flag given twice is a mistake either way it is read (the last one silently
    // winning served --port=18443 --port=18444 on 18444).
    auto [it, added] = flags.values.emplace(name, value);
    if (!added && name != "filename") {
      return Status::InvalidArgument("flag --" + name + " given twice (" + it->second + " and " +
                                     value + "); give it once");
    }
  }
  return flags;
}

Status CheckKnown(const Flags& flags, std::initializer_list<const char*> known) {
  for (const auto& [name, value] : flags.values) {
    bool ok = false;
    for (const char* k : known) ok = ok || name == k;
    if (!ok) return Status::InvalidArgument("unknown flag --" + name + " (see --help)");
  }
  return Status::Ok();
}

// "90s", "2m" and the like, for a message.
std::string ShowDuration(std::chrono::milliseconds d) {
  const long long ms = d.count();
  if (ms != 0 && ms % 3600000 == 0) return std::to_string(ms / 3600000) + "h";
  if (ms != 0 && ms % 60000 == 0) return std::to_string(ms / 60000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

// A whole number of ms, s, m or h within [min, max]. Each flag has its own bounds: a deadline
// of 0 cuts every connection at once and a reload interval of 0 polls the certificate files in
// a busy loop, while the server would start and report ready either way.
Result<std::chrono::milliseconds> ParseDuration(const std::string& flag, const std::string& text,
                                                std::chrono::milliseconds min,
                                                std::chrono::milliseconds max) {
  size_t pos = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &pos);
  } catch (const std::exception&) {
  }
  const std::string unit = text.substr(pos);
  long long unit_ms = 0;
  if (unit == "ms") unit_ms = 1;
  if (unit == "s") unit_ms = 1000;
  if (unit == "m") unit_ms = 60000;
  if (unit == "h") unit_ms = 3600000;
  // Bounded before multiplying: a huge count would overflow.
  if (n >= 0 && unit_ms > 0 && n <= max.count() / unit_ms) {
    const std::chrono::milliseconds d(n * unit_ms);
    if (d >= min) return d;
  }
  if (n >= 0 && unit.empty()) {
    return Status::InvalidArgument("--" + flag + "=" + text + " has no unit: write it like " +
                                   "500ms, 5s or 1m");
  }
  return Status::InvalidArgument("--" + flag + "=" + text + " must be a duration from " +
                                 ShowDuration(min) + " to " + ShowDuration(max) +
                                 ", like 500ms, 5s or 1m");
}

Result<int> ParseInt(const std::string& flag, const std::string& text, int min, int max) {
  try {
    size_t pos = 0;
    const long v = std::stol(text, &pos);
    if (pos == text.size() && v >= min && v <= max) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  return Status::InvalidArgument("--" + flag + "=" + text + " must be a whole number from " +
                                 std::to_string(min) + " to " + std::to_string(max));
}

// One line on stderr, exit 1: what a crash-looping pod's `kubectl logs` shows.
int Fail(const Status& s) {
  std::fprintf(stderr, "kv-offload-webhook: %s\n", s.message().c_str());
  return 1;
}

// `code`, once stdout is written out; 1 when it could not be: `inject -f x.yaml > out.yaml` on a
// full disk left out.yaml empty or cut short, and the GitOps step passed.
int FlushOutput(int code) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
  return Fail(Status::IOError(std::string("cannot write the output (stdout): ") +
                              std::strerror(errno)));
}

// Commands take flags only; a stray word is a typo (`serve 8443`), never silently ignored.
Status CheckNoPositional(const Flags& flags, const char* command) {
  if (flags.positional.empty()) return Status::Ok();
  return Status::InvalidArgument("unexpected argument \"" + flags.positional.front() + "\" for " +
                                 command + " (flags are --name=value; see --help)");
}

// spdlog maps a level it does not know to "off": a typo would silence the webhook.
Status CheckLogLevel(const std::string& level) {
  for (const char* known : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (level == known) return Status::Ok();
  }
  return Status::InvalidArgument("--log-level=" + level +
                                 ": use trace, debug, info, warn, error, critical or off");
}

// Each connection is a file descriptor; the usual soft limit (1024) would make accept() fail
// long before --max-connections. Raised to the hard limit, which must leave room for the cap.
Status RaiseFileLimit(int max_connections) {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return Status::Ok();
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  constexpr int kSpare = 64;  // certificates, metrics port, API server connections
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < static_cast<rlim_t>(max_connections + kSpare)) {
    return Status::InvalidArgument("--max-connections=" + std::to_string(max_connections) +
                                   " needs " + std::to_string(max_connections + kSpare) +
                                   " file descriptors but the limit is " +
                                   std::to_string(rl.rlim_max) +
                                   " (lower --max-connections or raise the open files limit)");
  }
  return Status::Ok();
}

// --agent-image is written into every agent-mode pod: one with a blank or a control character
// would leave them all in InvalidImageName.
Status CheckAgentImage(const std::string& image) {
  if (std::any_of(image.begin(), image.end(),
                  [](unsigned char c) { return c <= ' ' || c == 0x7f; })) {
    return Status::InvalidArgument("--agent-image=" + image +
                                   " is not an image reference: it holds a blank or a control "
                                   "character");
  }
  return Status::Ok();
}

// --kserve-namespace: a namespace name, looked up as one.
Result<std::string> KServeNamespace(const Flags& flags) {
  const std::string ns = flags.Get("kserve-namespace", kDefaultKServeNamespace);
  if (!IsDns1123Label(ns)) {
    return Status::InvalidArgument("--kserve-namespace=" + ns +
                                   " is not a namespace name: lowercase letters, digits and '-', "
                                   "at most 63, starting and ending with a letter or digit");
  }
  return ns;
}

int Serve(const Flags& flags) {
  if (Status s = CheckKnown(flags, {"port", "metrics-port", "bind-address", "tls-cert-file",
                                    "tls-key-file", "client-ca-file", "kubeconfig", "agent-image",
                                    "default-mode", "log-format", "log-level", "shutdown-delay",
                                    "cert-reload-interval", "lookup-timeout", "cache-ttl",
                                    "kserve-namespace",
                                    "threads", "max-connections", "request-timeout",
                                    "handshake-timeout", "idle-timeout"});
      !s.ok()) {
    return Fail(s);
  }
  if (Status s = CheckNoPositional(flags, "serve"); !s.ok()) return Fail(s);
  if (Status s = CheckLogLevel(flags.Get("log-level", "info")); !s.ok()) return Fail(s);
  const std::string log_format = flags.Get("log-format", "text");
  if (log_format != "text" && log_format != "json") {
    return Fail(Status::InvalidArgument("--log-format=" + log_format + ": use text or json"));
  }
  ConfigureLogging(log_format == "json" ? LogFormat::kJson : LogFormat::kText,
                   flags.Get("log-level", "info"));

  ServerOptions so;
  Result<int> port = ParseInt("port", flags.Get("port", "8443"), 0, 65535);
  Result<int> metrics_port = ParseInt("metrics-port", flags.Get("metrics-port", "9090"), -1, 65535);
  Result<int> threads = ParseInt("threads", flags.Get("threads", "64"), 1, 4096);
  Result<int> max_conns = ParseInt("max-connections", flags.Get("max-connections", "4096"), 1, 1000000);
  using std::chrono::milliseconds;
  using std::chrono::hours;
  const milliseconds kMs(1);
  Result<milliseconds> request_timeout = ParseDuration(
      "request-timeout", flags.Get("request-timeout", "10s"), kMs, hours(1));
  Result<milliseconds> handshake_timeout = ParseDuration(
      "handshake-timeout", flags.Get("handshake-timeout", "5s"), kMs, hours(1));
  Result<milliseconds> idle_timeout =
      ParseDuration("idle-timeout", flags.Get("idle-timeout", "120s"), kMs, hours(24));
  Result<milliseconds> delay =
      ParseDuration("shutdown-delay", flags.Get("shutdown-delay", "5s"), milliseconds(0), hours(1));
  Result<milliseconds> poll = ParseDuration(
      "cert-reload-interval", flags.Get("cert-reload-interval", "1s"), milliseconds(10), hours(1));
  Result<milliseconds> lookup =
      ParseDuration("lookup-timeout", flags.Get("lookup-timeout", "2s"), milliseconds(0), hours(1));
  Result<milliseconds> ttl =
      ParseDuration("cache-ttl", flags.Get("cache-ttl", "10s"), milliseconds(0), hours(1));
  Result<Mode> mode = ParseMode(flags.Get("default-mode", "agent"));
  for (const Status& s : {port.status(), metrics_port.status(), threads.status(), max_conns.status(),
                          request_timeout.status(), handshake_timeout.status(),
                          idle_timeout.status(), delay.status(), poll.status(), lookup.status(),
                          ttl.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (!mode.ok()) return Fail(Status::InvalidArgument("--default-mode: " + mode.status().message()));
  if (*port != 0 && *port == *metrics_port) {
    return Fail(Status::InvalidArgument("--metrics-port=" + std::to_string(*metrics_port) +
                                        " is --port's too: give the metrics a port of their own "
                                        "(or -1: off)"));
  }
  // The API server waits at most 30 s for a webhook (timeoutSeconds' ceiling); a budget at or
  // past it would never be the one that answers.
  if (lookup->count() <= 0 || *lookup >= std::chrono::seconds(30)) {
    return Fail(Status::InvalidArgument("--lookup-timeout=" + flags.Get("lookup-timeout") +
                                        " must be above 0 and below the webhooks' timeoutSeconds "
                                        "(at most 30s; the manifests use 5s)"));
  }
  so.port = *port;
  so.metrics_port = *metrics_port;
  so.threads = *threads;
  so.max_connections = *max_conns;
  so.request_timeout = *request_timeout;
  so.handshake_timeout = *handshake_timeout;
  so.idle_timeout = *idle_timeout;
  if (Status s = RaiseFileLimit(so.max_connections); !s.ok()) return Fail(s);
  so.shutdown_delay = *delay;
  so.cert_poll_interval = *poll;
  so.bind_address = flags.Get("bind-address", "0.0.0.0");
  // Checked here, before the start-up lines, as every other flag is (a scoped IPv6 address,
  // "fe80::1%eth0", is left to the listener, which reads it).
  if (in6_addr a6{}; so.bind_address.find('%') == std::string::npos &&
                     ::inet_pton(AF_INET, so.bind_address.c_str(), &a6) != 1 &&
                     ::inet_pton(AF_INET6, so.bind_address.c_str(), &a6) != 1) {
    return Fail(Status::InvalidArgument("--bind-address=" + so.bind_address +
                                        " is not an IP address (0.0.0.0 for every IPv4 "
                                        "address, :: for every address)"));
  }
  so.cert_file = flags.Get("tls-cert-file");
  so.key_file = flags.Get("tls-key-file");
  so.client_ca_file = flags.Get("client-ca-file");
  if (so.cert_file.empty() || so.key_file.empty()) {
    return Fail(Status::InvalidArgument("--tls-cert-file and --tls-key-file are required"));
  }
  AdmissionOptions ao;
  ao.default_mode = *mode;
  ao.agent_image = flags.Get("agent-image", kDefaultAgentImage);
  ao.lookup_budget = *lookup;
  Result<std::string> kserve_namespace = KServeNamespace(flags);
  if (!kserve_namespace.ok()) return Fail(kserve_namespace.status());
  ao.kserve_namespace = *kserve_namespace;
  if (ao.default_mode == Mode::kAgent && ao.agent_image.empty()) {
    return Fail(Status::InvalidArgument("--default-mode=agent needs a non-empty --agent-image"));
  }
  if (Status s = CheckAgentImage(ao.agent_image); !s.ok()) return Fail(s);

  // API access: --kubeconfig, else in-cluster, else none (annotation specs only).
  Metrics metrics;
  std::unique_ptr<KubeClusterReader> kube;
  Result<KubeConnection> conn = Status::NotFound("no kubeconfig");
  if (const std::string kc = flags.Get("kubeconfig"); !kc.empty()) {
    conn = LoadKubeconfig(kc);
    if (!conn.ok()) return Fail(conn.status());
  } else {
    conn = InClusterConnection("/var/run/secrets/kubernetes.io/serviceaccount");
    // In a pod whose service account cannot be used (its token not mounted, the CA file
    // unreadable, a bad port), serving with lookups off admitted every pod whose spec comes
    // from an LLMInferenceService or a namespace default without offloading, under
    // failurePolicy Fail: a broken setup is refused at start instead. Only outside a pod
    // (NotFound) are lookups off.
    if (!conn.ok() && conn.status().code() != StatusCode::kNotFound) return Fail(conn.status());
  }
  std::unique_ptr<CachingClusterReader> cached;
  if (conn.ok()) {
    conn->timeout = *lookup;  // no single GET may take longer than all of them
    kube = std::make_unique<KubeClusterReader>(*conn);
    cached = std::make_unique<CachingClusterReader>(kube.get(), *ttl, std::chrono::minutes(5), &metrics);
  }
  AdmissionHandler handler(ao, cached.get());

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // SIGHUP, often sent to ask for a reload, killed the process mid-admission: the
  // certificate reloads by itself when its files change, so it is said and ignored.
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  // The certificate is loaded here: a bad one is the only line printed before exit 1.
  Result<std::unique_ptr<Server>> server = Server::Create(so, &handler, &metrics);
  if (!server.ok()) return Fail(server.status());
  // Listening is the last check that can fail: nothing is logged before it, so a port in use
  // is one line.
  if (Status s = (*server)->Start(); !s.ok()) return Fail(s);
  if (conn.ok()) {
    LogEvent(spdlog::level::info, "API server lookups on", {{"host", conn->host}, {"port", conn->port}});
  } else {
    LogEvent(spdlog::level::warn, "API server lookups off: only pod annotation specs are served",
             {{"reason", conn.status().message()}});
  }
  int sig = 0;
  while (sigwait(&set, &sig) == 0 && sig == SIGHUP) {
    LogEvent(spdlog::level::info,
             "SIGHUP ignored: the serving certificate is re-read when its files change, and "
             "SIGTERM stops the webhook",
             {});
  }
  LogEvent(spdlog::level::info, "signal received", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  (*server)->Shutdown();
  return 0;
}

// A file's bytes, or stdin's for "-".
Result<std::string> ReadInput(const std::string& name) {
  return name == "-" ? ReadAll(STDIN_FILENO, "stdin") : ReadWholeFile(name);
}

// One -f's inputs: a file, stdin ("-"), or as kubectl reads a directory, its *.yaml, *.yml and
// *.json files in name order (not its subdirectories).
Result<std::vector<ManifestFile>> ReadManifests(const std::string& name) {
  std::error_code ec;
  if (name == "-" || !std::filesystem::is_directory(name, ec)) {
    Result<std::string> text = ReadInput(name);
    if (!text.ok()) return Status::InvalidArgument("-f " + text.status().message());
    return std::vector<ManifestFile>{{name == "-" ? "" : name, std::move(*text)}};
  }
  std::vector<std::filesystem::path> paths;
  for (std::filesystem::directory_iterator it(name, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    // Anything of those names but a directory: a link to nothing is read (and named as
    // unreadable) as kubectl reads it, not passed over without a word.
    if ((ext == ".yaml" || ext == ".yml" || ext == ".json") && !it->is_directory(ec)) {
      paths.push_back(it->path());
    }
  }
  if (ec) {
    return Status::InvalidArgument("-f " + name + ": cannot list the directory: " + ec.message());
  }
  if (paths.empty()) {
    return Status::InvalidArgument("-f " + name +
                                   ": the directory has no .yaml, .yml or .json file");
  }
  std::sort(paths.begin(), paths.end());
  std::vector<ManifestFile> files;
  for (const std::filesystem::path& path : paths) {
    Result<std::string> text = ReadInput(path.string());
    if (!text.ok()) return Status::InvalidArgument("-f " + text.status().message());
    files.push_back({path.string(), std::move(*text)});
  }
  return files;
}

// Every -f's inputs, in the order given, read as one input, as kubectl reads several -f.
Result<std::vector<ManifestFile>> ReadAllManifests(const Flags& flags, const char* command) {
  if (flags.filenames.empty()) {
    return Status::InvalidArgument(std::string(command) +
                                   " needs -f FILE or DIR (or -f - for stdin)");
  }
  std::vector<ManifestFile> all;
  for (const std::string& name : flags.filenames) {
    if (name.empty()) return Status::InvalidArgument("-f is empty: give a file, a directory or -");
    Result<std::vector<ManifestFile>> files = ReadManifests(name);
    if (!files.ok()) return files.status();
    all.insert(all.end(), std::make_move_iterator(files->begin()),
               std::make_move_iterator(files->end()));
  }
  return all;
}

// The options `inject` and `validate` share (all but the input file).
Status ReadOfflineOptions(const Flags& flags, InjectOptions* opts) {
  Result<Mode> mode = ParseMode(flags.Get("default-mode", "agent"));
  if (!mode.ok()) return Status::InvalidArgument("--default-mode: " + mode.status().message());
  opts->default_mode = *mode;
  opts->agent_image = flags.Get("agent-image", kDefaultAgentImage);
  if (Status s = CheckAgentImage(opts->agent_image); !s.ok()) return s;
  Result<std::string> kserve_namespace = KServeNamespace(flags);
  if (!kserve_namespace.ok()) return kserve_namespace.status();
  opts->kserve_namespace = *kserve_namespace;
  opts->namespace_name = flags.Get("namespace", "default");
  // The namespace of the documents that lack one, for resolving their specs (the documents
  // are written back without it): a name that is not a DNS-1123 label names no namespace.
  if (const std::string& ns = opts->namespace_name; !IsDns1123Label(ns)) {
    return Status::InvalidArgument("--namespace=" + ns +
                                   " is not a namespace name: lowercase letters, digits and '-', "
                                   "at most 63, starting and ending with a letter or digit");
  }
  if (flags.values.contains("config")) {
    std::string config = flags.Get("config");
    if (config.empty()) {
      return Status::InvalidArgument("--config is empty: give a spec as JSON or @FILE, or "
                                     "leave the flag out");
    }
    if (config[0] == '@') {
      Result<std::string> text = ReadInput(config.substr(1));
      if (!text.ok()) return Status::InvalidArgument("--config: " + text.status().message());
      config = *text;
    }
    Result<nlohmann::json> spec = ParseJson(config, "--config");
    if (!spec.ok()) return spec.status();
    // Checked here, not only when a document falls back to it: a bad --config passed every
    // run whose documents all had a spec of their own, until the one that did not.
    if (Result<OffloadSpec> parsed = ParseSpecFrom(*spec, SpecSource::CommandLine());
        !parsed.ok()) {
      return Status::InvalidArgument("--config: " + parsed.status().message());
    }
    opts->config = *spec;
  }
  return Status::Ok();
}

// One "Error: " line per line of the message: InjectManifests reports each error on its own.
void PrintErrors(const std::string& message) {
  size_t start = 0;
  while (start <= message.size()) {
    size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    std::fprintf(stderr, "Error: %s\n", message.substr(start, end - start).c_str());
    start = end + 1;
  }
}

int Inject(const Flags& flags) {
  if (Status s = CheckKnown(flags, {"filename", "namespace", "config", "default-mode", "agent-image",
                                    "kserve-namespace"});
      !s.ok()) {
    return Fail(s);
  }
  if (Status s = CheckNoPositional(flags, "inject"); !s.ok()) return Fail(s);
  InjectOptions opts;
  if (Status s = ReadOfflineOptions(flags, &opts); !s.ok()) return Fail(s);
  Result<std::vector<ManifestFile>> input = ReadAllManifests(flags, "inject");
  if (!input.ok()) return Fail(input.status());
  Result<InjectResult> out = InjectManifests(*input, opts);
  if (!out.ok()) {
    PrintErrors(out.status().message());
    return 1;
  }
  for (const std::string& w : out->warnings) std::fprintf(stderr, "Warning: %s\n", w.c_str());
  std::fwrite(out->output.data(), 1, out->output.size(), stdout);
  return FlushOutput(0);
}

// Errors and warnings on stderr, one per line with the object and the field path; a summary on
// stdout. Exit 1 when any object is invalid (or the input cannot be read), 0 otherwise.
int Validate(const Flags& flags) {
  if (Status s = CheckKnown(flags, {"filename", "namespace", "config", "default-mode", "agent-image",
                                    "kserve-namespace"});
      !s.ok()) {
    return Fail(s);
  }
  if (Status s = CheckNoPositional(flags, "validate"); !s.ok()) return Fail(s);
  InjectOptions opts;
  if (Status s = ReadOfflineOptions(flags, &opts); !s.ok()) return Fail(s);
  Result<std::vector<ManifestFile>> input = ReadAllManifests(flags, "validate");
  if (!input.ok()) return Fail(input.status());
  Result<std::vector<ObjectReport>> reports = ValidateManifests(*input, opts);
  if (!reports.ok()) {
    PrintErrors(reports.status().message());
    return 1;
  }
  size_t invalid = 0;
  for (const ObjectReport& r : *reports) {
    for (const std::string& e : r.errors) {
      std::fprintf(stderr, "Error: %s: %s\n", r.object.c_str(), e.c_str());
    }
    for (const std::string& w : r.warnings) {
      std::fprintf(stderr, "Warning: %s: %s\n", r.object.c_str(), w.c_str());
    }
    if (!r.errors.empty()) ++invalid;
  }
  std::printf("%zu object(s) with a kvCacheOffloading spec checked, %zu invalid\n",
              reports->size(), invalid);
  return FlushOutput(invalid > 0 ? 1 : 0);
}

int Main(int argc, char** argv) {
  std::string command = "serve";
  int start = 1;
  if (argc > 1 && argv[1][0] != '-') {
    command = argv[1];
    start = 2;
  }
  Result<Flags> flags = ParseFlags(argc, argv, start);
  if (!flags.ok()) return Fail(flags.status());
  if (flags->values.count("help") > 0 || command == "help") {
    std::fputs(kUsage, stdout);
    return FlushOutput(0);
  }
  if (command == "version") {
    std::puts(KVOFFLOAD_VERSION);
    return FlushOutput(0);
  }
  if (command == "serve") return Serve(*flags);
  if (command == "inject") return Inject(*flags);
  if (command == "validate") return Validate(*flags);
  return Fail(Status::InvalidArgument("unknown command \"" + command +
                                      "\" (serve, inject, validate, version)"));
}

}  // namespace
}  // namespace kvoffload::webhook

int main(int argc, char** argv) { return kvoffload::webhook::Main(argc, argv); }
