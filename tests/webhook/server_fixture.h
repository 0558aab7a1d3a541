// What the tests that start a real Server share: its certificate files and loopback options,
// and the AdmissionReview they post most.
#ifndef KVOFFLOAD_TESTS_WEBHOOK_SERVER_FIXTURE_H_
#define KVOFFLOAD_TESTS_WEBHOOK_SERVER_FIXTURE_H_

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "test_pki.h"
#include "webhook/server.h"

namespace kvoffload::webhook::testing {

// A fresh Pki named `name`, written into `dir` as the webhook's Secret volume holds it:
// tls.crt, tls.key and ca.crt.
Pki WriteServingPki(const std::filesystem::path& dir, const std::string& name);

// Options that serve `dir`'s tls.crt and tls.key on 127.0.0.1, with the admission and metrics
// ports chosen by the kernel; each test sets what it exercises on top.
ServerOptions LoopbackServerOptions(const std::filesystem::path& dir);

// The AdmissionReview (CREATE, namespace team-a, uid u1) of `pod`.
std::string PodReview(const nlohmann::json& pod);

// PodReview of a pod with one container whose kvoffload.io/config annotation asks for a 1Gi
// pinned CPU tier: admitted with a patch.
std::string AnnotatedPodReview();

}  // namespace kvoffload::webhook::testing

#endif  // KVOFFLOAD_TESTS_WEBHOOK_SERVER_FIXTURE_H_
