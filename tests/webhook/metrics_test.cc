// The webhook's metrics as a scraper sees them: admissions of every skip reason and failure type
// go through the HTTPS server (real TLS, the real handler and resolver), then /metrics is read
// back and parsed. Each reason and type gets a different number of admissions, so a label that
// counts the wrong thing shows as a wrong number, not as a passing test.
#include "webhook/metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "exposition.h"
#include "server_fixture.h"
#include "test_pki.h"
#include "webhook/admission.h"
#include "webhook/cluster_reader.h"
#include "webhook/log.h"
#include "webhook/server.h"

namespace kvoffload::webhook {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Exposition;
using testing::ParseExposition;

constexpr char kDuration[] = "kvoffload_admission_duration_seconds";

json Pod(const std::map<std::string, std::string>& annotations,
         const std::map<std::string, std::string>& labels = {}) {
  json metadata = {{"generateName", "vllm-"}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  if (!labels.empty()) metadata["labels"] = labels;
  return {{"metadata", metadata}, {"spec", {{"containers", {{{"name", "main"}}}}}}};
}

json LlmisvcPod(const std::string& service) {
  return Pod({}, {{"app.kubernetes.io/part-of", "llminferenceservice"},
                  {"app.kubernetes.io/name", service}});
}

std::string Review(const json& pod, const std::string& operation = "CREATE",
                   const std::string& kind = "Pod") {
  return json{{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request",
               {{"uid", "u"},
                {"kind", {{"group", ""}, {"version", "v1"}, {"kind", kind}}},
                {"namespace", "team-a"},
                {"operation", operation},
                {"object", pod}}}}
      .dump();
}

std::string Unbase64(const std::string& in) {
  std::string out(in.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

// LLMInferenceService "down" cannot be read (an API server outage), "boom" throws (a bug in a
// layer below the handler); nothing else exists.
class TroubledReader : public ClusterReader {
 public:
  Result<std::optional<json>> GetBefore(const ObjectRef& ref, Deadline) override {
    if (ref.kind == ObjectKind::kLLMInferenceService && ref.name == "down") {
      return Status::Unavailable("connection refused");
    }
    if (ref.kind == ObjectKind::kLLMInferenceService && ref.name == "boom") {
      throw std::runtime_error("reader bug");
    }
    return std::optional<json>();
  }
  bool Authoritative() const override { return true; }
};

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    testing::WriteServingPki(dir_, "metrics");
    ServerOptions o = testing::LoopbackServerOptions(dir_);
    o.shutdown_delay = std::chrono::milliseconds(0);
    o.threads = 4;
    Result<std::unique_ptr<Server>> s = Server::Create(o, &handler_, &metrics_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start().ok());
    client_ = std::make_unique<httplib::SSLClient>("127.0.0.1", server_->port());
    client_->set_ca_cert_path((dir_ / "ca.crt").string().c_str());
    client_->enable_server_certificate_verification(true);
    client_->set_read_timeout(5, 0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    fs::remove_all(dir_);
  }

  // POSTs to /mutate-pods; returns the AdmissionReview response (null for a non-JSON answer).
  json Admit(const std::string& body, const std::string& content_type = "application/json") {
    httplib::Result r = client_->Post("/mutate-pods", body, content_type);
    EXPECT_TRUE(r) << httplib::to_string(r.error());
    if (!r || r->status != 200) return json();
    return json::parse(r->body)["response"];
  }

  Exposition Scrape() {
    httplib::Client metrics("127.0.0.1", server_->metrics_port());
    httplib::Result m = metrics.Get("/metrics");
    EXPECT_TRUE(m);
    if (!m) return {};
    Exposition e = ParseExposition(m->body);
    EXPECT_TRUE(e.errors.empty()) << e.errors.front();
    return e;
  }

  fs::path dir_;
  TroubledReader reader_;
  AdmissionHandler handler_{AdmissionOptions{}, &reader_};
  Metrics metrics_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<httplib::SSLClient> client_;
};

TEST_F(MetricsServerTest, EverySkipReasonAndFailureTypeIsCountedWithItsLatency) {
  const json with_spec = Pod({{"kvoffload.io/config", R"({"cpu":"1Gi"})"}});
  int injected = 0;
  std::map<std::string, int> skips;
  std::map<std::string, int> failures;
  auto repeat = [](int n, auto&& admit) {
    for (int i = 0; i < n; ++i) admit();
  };

  // success: 1. Its patched pod is admitted again below (already_injected).
  json first = Admit(Review(with_spec));
  ASSERT_TRUE(first.contains("patch")) << first;
  const json patched = with_spec.patch(json::parse(Unbase64(first["patch"].get<std::string>())));
  ++injected;

  // Skips: 1, 2, 3 and 4 admissions.
  repeat(1, [&] { EXPECT_EQ(Admit(Review(with_spec, "UPDATE"))["allowed"], true); });
  skips["not_create"] = 1;
  repeat(2, [&] {
    json r = Admit(Review(Pod({{"kvoffload.io/config", R"({"cpu":"1Gi"})"}},
                              {{"kvoffload.io/inject", "false"}})));
    EXPECT_FALSE(r.contains("patch")) << r;
  });
  skips["opted_out"] = 2;
  repeat(3, [&] { EXPECT_EQ(Admit(Review(Pod({})))["allowed"], true); });
  skips["no_spec"] = 3;
  repeat(4, [&] {
    json r = Admit(Review(patched));
    EXPECT_EQ(r["allowed"], true);
    EXPECT_FALSE(r.contains("patch")) << r;
  });
  skips["already_injected"] = 4;

  // Failures: 1 to 5 admissions; bad_request mixes every malformed kind of request.
  EXPECT_TRUE(Admit(Review(with_spec), "text/plain").is_null());  // 415
  EXPECT_EQ(Admit("{not json")["status"]["code"], 400);
  EXPECT_EQ(Admit(Review(with_spec, "CREATE", "Service"))["status"]["code"], 400);
  EXPECT_EQ(Admit(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",)"
                  R"("request":{"uid":"u","kind":{"kind":"Pod"},"operation":"CREATE"}})")
                ["status"]["code"],
            400);  // no request.object
  json v1beta1 = json::parse(Review(with_spec));
  v1beta1["apiVersion"] = "admission.k8s.io/v1beta1";
  EXPECT_EQ(Admit(v1beta1.dump())["status"]["code"], 400);
  failures["bad_request"] = 5;
  repeat(2, [&] {
    EXPECT_EQ(Admit(Review(Pod({{"kvoffload.io/config", R"({"cpu":"0"})"}})))["status"]["code"],
              403);
  });
  failures["invalid_spec"] = 2;
  repeat(3, [&] {
    json r = Admit(Review(Pod({{"kvoffload.io/config", R"({"cpu":"1Gi"})"},
                               {"kvoffload.io/mode", "sidecar"}})));
    EXPECT_EQ(r["status"]["code"], 403) << r;
  });
  failures["rejected"] = 3;
  repeat(4, [&] { EXPECT_EQ(Admit(Review(LlmisvcPod("down")))["status"]["code"], 500); });
  failures["lookup"] = 4;
  repeat(1, [&] {
    httplib::Result r =
        client_->Post("/mutate-pods", Review(LlmisvcPod("boom")), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500);
  });
  failures["internal"] = 1;
  // Apply-time checks are counted apart and must move none of the pod counters.
  ASSERT_TRUE(
      client_->Post("/validate", Review(with_spec, "CREATE", "Namespace"), "application/json"));

  const Exposition e = Scrape();
  int skipped_total = 0;
  int failed_total = 0;
  for (const auto& [reason, n] : skips) {
    EXPECT_EQ(e.Sum("kvoffload_injection_skip_total", {{"reason", reason}}), n) << reason;
    skipped_total += n;
  }
  for (const auto& [type, n] : failures) {
    EXPECT_EQ(e.Sum("kvoffload_injection_failure_total", {{"type", type}}), n) << type;
    failed_total += n;
  }
  // Every series exists, with no reason or type the test does not know (or does not drive).
  EXPECT_EQ(e.Count("kvoffload_injection_skip_total"), skips.size());
  EXPECT_EQ(e.Count("kvoffload_injection_failure_total"), failures.size());
  const int total = injected + skipped_total + failed_total;
  EXPECT_EQ(e.Sum("kvoffload_injection_success_total"), injected);
  EXPECT_EQ(e.Sum("kvoffload_injection_requests_total"), total);

  // The outcome counter the dashboards and e2e already read, and the histogram per outcome.
  const std::map<std::string, int> by_outcome = {
      {"injected", injected},
      {"unchanged", skips["already_injected"]},
      {"skipped", skipped_total - skips["already_injected"]},
      {"denied", failures["invalid_spec"] + failures["rejected"]},
      {"error", failures["bad_request"] + failures["lookup"] + failures["internal"]}};
  for (const auto& [outcome, n] : by_outcome) {
    EXPECT_EQ(e.Sum("kvoffload_admission_requests_total", {{"outcome", outcome}}), n) << outcome;
    EXPECT_EQ(e.Sum(std::string(kDuration) + "_count", {{"outcome", outcome}}), n) << outcome;
    EXPECT_EQ(e.Sum(std::string(kDuration) + "_bucket", {{"outcome", outcome}, {"le", "+Inf"}}), n)
        << outcome;
    EXPECT_GT(e.Sum(std::string(kDuration) + "_sum", {{"outcome", outcome}}), 0) << outcome;
  }
  EXPECT_EQ(e.Sum("kvoffload_admission_requests_total"), total);
  EXPECT_EQ(e.Sum("kvoffload_validation_requests_total"), 1);
  EXPECT_EQ(e.types.at("kvoffload_injection_skip_total"), "counter");
  EXPECT_EQ(e.types.at("kvoffload_injection_failure_total"), "counter");
  EXPECT_EQ(e.types.at(kDuration), "histogram");
}

// The webhook's JSON log lines (ConfigureLogging(kJson)) written while `act` runs.
std::vector<nlohmann::json> LoggedDuring(const std::function<void()>& act) {
  ConfigureLogging(LogFormat::kJson, "info");
  ::testing::internal::CaptureStderr();
  act();
  spdlog::default_logger()->flush();
  std::istringstream lines(::testing::internal::GetCapturedStderr());
  std::vector<nlohmann::json> events;
  for (std::string line; std::getline(lines, line);) {
    events.push_back(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
  }
  return events;
}

// A request the transport answers itself (a body over the limit) counts as a failed pod
// admission only where it is one: a POST. A PUT of 9 MB to /mutate-pods was counted, and logged,
// as a failed admission of a pod.
TEST_F(MetricsServerTest, OnlyAPostRefusedByTheTransportIsAFailedAdmission) {
  const std::string big(9 << 20, ' ');
  httplib::Result put = client_->Put("/mutate-pods", big, "application/json");
  ASSERT_TRUE(put) << httplib::to_string(put.error());
  EXPECT_EQ(put->status, 413);
  EXPECT_EQ(Scrape().Sum("kvoffload_admission_requests_total"), 0);
  client_ = std::make_unique<httplib::SSLClient>("127.0.0.1", server_->port());
  client_->set_ca_cert_path((dir_ / "ca.crt").string().c_str());
  client_->enable_server_certificate_verification(true);
  const std::vector<nlohmann::json> logged = LoggedDuring([&] {
    httplib::Result post = client_->Post("/mutate-pods", big, "application/json");
    ASSERT_TRUE(post) << httplib::to_string(post.error());
    EXPECT_EQ(post->status, 413);
  });
  // Its log line says how long the client took to it, as an admission's does.
  const auto line = std::find_if(logged.begin(), logged.end(), [](const nlohmann::json& j) {
    return j.value("msg", "") == "admission";
  });
  ASSERT_NE(line, logged.end()) << nlohmann::json(logged).dump();
  EXPECT_EQ((*line)["status"], 413);
  ASSERT_TRUE((*line)["seconds"].is_number()) << line->dump();
  EXPECT_GT((*line)["seconds"].get<double>(), 0.0);
  EXPECT_LT((*line)["seconds"].get<double>(), 60.0);
  const Exposition e = Scrape();
  EXPECT_EQ(e.Sum("kvoffload_admission_requests_total", {{"outcome", "error"}}), 1);
  EXPECT_EQ(e.Sum("kvoffload_injection_failure_total", {{"type", "bad_request"}}), 1);
}

// A webhook configuration with a wrong path (/mutate-podz) sends every pod to a 404: no
// admission was counted and nothing was logged, so the metrics showed nothing while, with
// failurePolicy Fail, no pod was created. Counted apart, by status, and logged with the
// method and path asked for.
TEST_F(MetricsServerTest, RequestsForNoRouteAreCountedApartAndLogged) {
  const std::vector<nlohmann::json> logged = LoggedDuring([&] {
    ASSERT_TRUE(client_->Post("/mutate-podz", "{}", "application/json"));
    ASSERT_TRUE(client_->Get("/mutate-pods"));
  });
  std::vector<nlohmann::json> unrouted;
  for (const nlohmann::json& e : logged) {
    if (e.value("msg", "") == "unrouted") unrouted.push_back(e);
  }
  ASSERT_EQ(unrouted.size(), 2u) << nlohmann::json(logged).dump();
  EXPECT_EQ(unrouted[0]["method"], "POST");
  EXPECT_EQ(unrouted[0]["path"], "/mutate-podz");
  EXPECT_EQ(unrouted[0]["status"], 404);
  EXPECT_EQ(unrouted[0]["level"], "warning");
  EXPECT_EQ(unrouted[1]["method"], "GET");
  EXPECT_EQ(unrouted[1]["path"], "/mutate-pods");
  EXPECT_EQ(unrouted[1]["status"], 405);
  for (int i = 0; i < 2; ++i) {
    httplib::Result r = client_->Post("/mutate-podz", "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
  }
  httplib::Result get = client_->Get("/mutate-pods");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  const Exposition e = Scrape();
  EXPECT_EQ(e.Sum("kvoffload_unrouted_requests_total", {{"status", "404"}}), 3);
  EXPECT_EQ(e.Sum("kvoffload_unrouted_requests_total", {{"status", "405"}}), 2);
  EXPECT_EQ(e.types.at("kvoffload_unrouted_requests_total"), "counter");
  EXPECT_EQ(e.Sum("kvoffload_admission_requests_total"), 0);
}

// `sum by (le)` over the outcome label is the histogram of every admission, as it was before
// the label existed: cumulative, and its +Inf bucket counts every request.
TEST(MetricsTest, HistogramBucketsPerOutcomeAddUpAcrossOutcomes) {
  Metrics m;
  m.RecordAdmission(AdmissionResult::Injected(), 0.0003);
  m.RecordAdmission(AdmissionResult::Injected(), 0.03);
  m.RecordAdmission(AdmissionResult::Skipped(SkipReason::kNoSpec), 0.0003);
  m.RecordAdmission(AdmissionResult::Failed(FailureType::kLookup), 7.0);  // past the last bucket
  const Exposition e = ParseExposition(m.Render());
  ASSERT_TRUE(e.errors.empty()) << e.errors.front();
  const std::string bucket = std::string(kDuration) + "_bucket";
  EXPECT_EQ(e.Sum(bucket, {{"outcome", "injected"}, {"le", "0.0005"}}), 1);
  EXPECT_EQ(e.Sum(bucket, {{"outcome", "injected"}, {"le", "0.025"}}), 1);
  EXPECT_EQ(e.Sum(bucket, {{"outcome", "injected"}, {"le", "0.05"}}), 2);
  EXPECT_EQ(e.Sum(bucket, {{"outcome", "skipped"}, {"le", "0.0005"}}), 1);
  EXPECT_EQ(e.Sum(bucket, {{"outcome", "error"}, {"le", "5"}}), 0);
  EXPECT_EQ(e.Sum(bucket, {{"outcome", "error"}, {"le", "+Inf"}}), 1);
  EXPECT_NEAR(e.Sum(std::string(kDuration) + "_sum", {{"outcome", "injected"}}), 0.0303, 1e-9);

  const std::vector<std::string> les = e.LabelValues(bucket, "le");
  ASSERT_EQ(les.size(), 14u);  // 13 bounds and +Inf, the same for every outcome
  double previous = 0;
  std::vector<std::pair<double, double>> by_le;  // (bound, sum over outcomes)
  for (const std::string& le : les) {
    by_le.emplace_back(le == "+Inf" ? 1e300 : std::stod(le), e.Sum(bucket, {{"le", le}}));
    EXPECT_EQ(e.Count(bucket, {{"le", le}}), 5u) << le;  // one series per outcome
  }
  std::sort(by_le.begin(), by_le.end());
  for (const auto& [bound, count] : by_le) {
    EXPECT_GE(count, previous) << "le " << bound;
    previous = count;
  }
  EXPECT_EQ(by_le.back().second, 4);
  EXPECT_EQ(e.Sum(std::string(kDuration) + "_count"), 4);
  EXPECT_EQ(e.Sum("kvoffload_injection_requests_total"), 4);
  EXPECT_EQ(m.skips(SkipReason::kNoSpec), 1u);
  EXPECT_EQ(m.failures(FailureType::kLookup), 1u);
}

// The sum was written with %g, six significant digits: past 29.8745 s of admissions, three more
// of 27 us each left it at 29.8745, and over a replica's life rate(_sum)/rate(_count) went flat.
TEST(MetricsTest, TheDurationSumKeepsEveryNanosecond) {
  Metrics m;
  for (int i = 0; i < 30; ++i) m.RecordAdmission(AdmissionResult::Failed(FailureType::kLookup), 0.99581);
  const std::string sum = std::string(kDuration) + "_sum";
  const double before = ParseExposition(m.Render()).Sum(sum, {{"outcome", "error"}});
  m.RecordAdmission(AdmissionResult::Failed(FailureType::kBadRequest), 0.000027);
  const double after = ParseExposition(m.Render()).Sum(sum, {{"outcome", "error"}});
  EXPECT_NEAR(after - before, 0.000027, 1e-9);
  // At a million seconds too (a replica's weeks of admissions).
  m.RecordAdmission(AdmissionResult::Failed(FailureType::kLookup), 1e6);
  const double big = ParseExposition(m.Render()).Sum(sum, {{"outcome", "error"}});
  m.RecordAdmission(AdmissionResult::Failed(FailureType::kBadRequest), 0.000027);
  EXPECT_NEAR(ParseExposition(m.Render()).Sum(sum, {{"outcome", "error"}}) - big, 0.000027, 1e-8);
}

TEST(MetricsTest, OutcomeFollowsFromReasonAndType) {
  EXPECT_EQ(AdmissionResult::Skipped(SkipReason::kAlreadyInjected).outcome(), Outcome::kUnchanged);
  EXPECT_EQ(AdmissionResult::Skipped(SkipReason::kNoSpec).outcome(), Outcome::kSkipped);
  EXPECT_EQ(AdmissionResult::Failed(FailureType::kInvalidSpec).outcome(), Outcome::kDenied);
  EXPECT_EQ(AdmissionResult::Failed(FailureType::kRejected).outcome(), Outcome::kDenied);
  EXPECT_EQ(AdmissionResult::Failed(FailureType::kLookup).outcome(), Outcome::kError);
  EXPECT_EQ(AdmissionResult::Failed(FailureType::kBadRequest).outcome(), Outcome::kError);
  EXPECT_STREQ(AdmissionResult::Skipped(SkipReason::kOptedOut).DetailName(), "opted_out");
  EXPECT_STREQ(AdmissionResult::Injected().DetailName(), "");
}

}  // namespace
}  // namespace kvoffload::webhook
