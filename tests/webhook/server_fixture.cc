#include "server_fixture.h"

namespace kvoffload::webhook::testing {

Pki WriteServingPki(const std::filesystem::path& dir, const std::string& name) {
  Pki pki = MakePki(name);
  WriteFileAtomic(dir / "tls.crt", pki.cert_pem);
  WriteFileAtomic(dir / "tls.key", pki.key_pem);
  WriteFileAtomic(dir / "ca.crt", pki.ca_pem);
  return pki;
}

ServerOptions LoopbackServerOptions(const std::filesystem::path& dir) {
  ServerOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.metrics_port = 0;
  o.cert_file = (dir / "tls.crt").string();
  o.key_file = (dir / "tls.key").string();
  return o;
}

std::string PodReview(const nlohmann::json& pod) {
  using nlohmann::json;
  return json{{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request",
               {{"uid", "u1"},
                {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                {"namespace", "team-a"},
                {"operation", "CREATE"},
                {"object", pod}}}}
      .dump();
}

std::string AnnotatedPodReview() {
  return PodReview(
      {{"metadata", {{"annotations", {{"kvoffload.io/config", R"({"cpu":"1Gi"})"}}}}},
       {"spec", {{"containers", {{{"name", "main"}}}}}}});
}

}  // namespace kvoffload::webhook::testing
