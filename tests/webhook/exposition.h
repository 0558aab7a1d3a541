// Reads Prometheus text exposition the way a scraper does, so tests assert on samples (name,
// labels, value) instead of on substrings of the rendered text. Test support; not thread-safe.
#ifndef KVOFFLOAD_TESTS_WEBHOOK_EXPOSITION_H_
#define KVOFFLOAD_TESTS_WEBHOOK_EXPOSITION_H_

#include <map>
#include <string>
#include <vector>

namespace kvoffload::webhook::testing {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // metric family -> "# TYPE" value
  std::vector<std::string> errors;           // lines that are not valid exposition

  // The sum of the samples named `name` whose labels include every pair of `match`, as
  // PromQL's sum(name{match}) over one scrape. 0 when none match.
  double Sum(const std::string& name, const std::map<std::string, std::string>& match = {}) const;
  // How many samples named `name` include every pair of `match`.
  size_t Count(const std::string& name, const std::map<std::string, std::string>& match = {}) const;
  // The distinct values of label `label` among the samples named `name`.
  std::vector<std::string> LabelValues(const std::string& name, const std::string& label) const;
};

Exposition ParseExposition(const std::string& text);

}  // namespace kvoffload::webhook::testing

#endif  // KVOFFLOAD_TESTS_WEBHOOK_EXPOSITION_H_
