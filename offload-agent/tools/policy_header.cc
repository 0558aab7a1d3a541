// kvoffload-policy-header OUTPUT.h: writes the list of eviction policies that libkvoffload
// registers as a C++ header, for the webhook to accept exactly those in agent mode. Run by the
// build, linked with the library it describes, so the list cannot drift from the agent. The file
// is rewritten only when its text changes, so an agent rebuild that keeps the names recompiles
// nothing in the webhook.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kvoffload/eviction_policy.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: kvoffload-policy-header OUTPUT.h\n";
    return 2;
  }
  const std::vector<std::string> names = kvoffload::EvictionPolicyNames();
  // Registry names are lowercase letters, digits and '-', so they need no escaping here.
  std::ostringstream text;
  text << "// Generated at build time by kvoffload-policy-header from libkvoffload's eviction\n"
          "// policy registry (EvictionPolicyNames()). Do not edit.\n"
          "#ifndef KVOFFLOAD_WEBHOOK_AGENT_EVICTION_POLICIES_H_\n"
          "#define KVOFFLOAD_WEBHOOK_AGENT_EVICTION_POLICIES_H_\n\n"
          "#include <array>\n#include <string_view>\n\n"
          "namespace kvoffload::webhook::generated {\n\n"
          "// Sorted.\n"
          "inline constexpr std::array<std::string_view, "
       << names.size() << "> kAgentEvictionPolicies = {";
  for (size_t i = 0; i < names.size(); ++i) text << (i ? ", " : "") << '"' << names[i] << '"';
  text << "};\n\n}  // namespace kvoffload::webhook::generated\n\n"
          "#endif  // KVOFFLOAD_WEBHOOK_AGENT_EVICTION_POLICIES_H_\n";

  const std::string path = argv[1];
  {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream old;
    old << in.rdbuf();
    if (in && old.str() == text.str()) return 0;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text.str();
  out.close();
  if (!out) {
    std::cerr << "kvoffload-policy-header: cannot write " << path << "\n";
    return 1;
  }
  return 0;
}
