#include "exposition.h"

#include <cstdlib>
#include <set>
#include <sstream>

namespace kvoffload::webhook::testing {
namespace {

bool Matches(const Sample& s, const std::string& name,
             const std::map<std::string, std::string>& match) {
  if (s.name != name) return false;
  for (const auto& [k, v] : match) {
    auto it = s.labels.find(k);
    if (it == s.labels.end() || it->second != v) return false;
  }
  return true;
}

// Parses `name{k="v",...} value` (label values without escapes: ours have none). False on
// anything else.
bool ParseSample(const std::string& line, Sample* out) {
  size_t i = line.find_first_of("{ ");
  if (i == std::string::npos || i == 0) return false;
  out->name = line.substr(0, i);
  if (line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
      const size_t close = line.find('"', eq + 2);
      if (close == std::string::npos) return false;
      out->labels[line.substr(i, eq - i)] = line.substr(eq + 2, close - eq - 2);
      i = close + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return false;
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') return false;
  const std::string value = line.substr(i + 1);
  char* end = nullptr;
  out->value = std::strtod(value.c_str(), &end);
  return !value.empty() && end == value.c_str() + value.size();
}

}  // namespace

double Exposition::Sum(const std::string& name,
                       const std::map<std::string, std::string>& match) const {
  double total = 0;
  for (const Sample& s : samples) {
    if (Matches(s, name, match)) total += s.value;
  }
  return total;
}

size_t Exposition::Count(const std::string& name,
                         const std::map<std::string, std::string>& match) const {
  size_t n = 0;
  for (const Sample& s : samples) n += Matches(s, name, match) ? 1u : 0u;
  return n;
}

std::vector<std::string> Exposition::LabelValues(const std::string& name,
                                                 const std::string& label) const {
  std::set<std::string> values;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    if (auto it = s.labels.find(label); it != s.labels.end()) values.insert(it->second);
  }
  return {values.begin(), values.end()};
}

Exposition ParseExposition(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream fields(line.substr(7));
      std::string family, type;
      fields >> family >> type;
      e.types[family] = type;
      continue;
    }
    Sample s;
    if (ParseSample(line, &s)) {
      e.samples.push_back(std::move(s));
    } else {
      e.errors.push_back(line);
    }
  }
  return e;
}

}  // namespace kvoffload::webhook::testing
