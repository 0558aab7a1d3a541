// kvoffload-admission-cost: answers one AdmissionReview body N times with the webhook's own
// handler (agent mode, no API server), the way the server does, and prints the bytes answered.
// Run under callgrind at two counts, the difference per extra admission is what one admission
// costs with the set-up (first parse, OpenSSL's fetches, the per-workload caches) left out:
// bench/webhook/run.py does that for both bench bodies.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "webhook/admission.h"
#include "webhook/json_util.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fputs("usage: kvoffload-admission-cost BODY_FILE COUNT\n", stderr);
    return 2;
  }
  std::ifstream file(argv[1]);
  if (!file) {
    std::fprintf(stderr, "kvoffload-admission-cost: cannot read %s\n", argv[1]);
    return 1;
  }
  std::stringstream text;
  text << file.rdbuf();
  std::string body = text.str();
  // The spare capacity the server's transport leaves after every body, so it parses in place.
  body.reserve(body.size() + kvoffload::webhook::kJsonPadding);
  const long count = std::strtol(argv[2], nullptr, 10);
  if (count <= 0) {
    std::fprintf(stderr, "kvoffload-admission-cost: COUNT %s is not a positive number\n", argv[2]);
    return 2;
  }
  const kvoffload::webhook::AdmissionHandler handler(
      {kvoffload::webhook::Mode::kAgent, "registry.example/kvoffload-agent:0.1.0"}, nullptr);
  size_t answered = 0;
  for (long i = 0; i < count; ++i) answered += handler.Handle("application/json", body).body.size();
  std::printf("%zu\n", answered);
  return 0;
}
