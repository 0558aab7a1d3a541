// Quantity::Parse on arbitrary text; a parsed value must survive its canonical form
// (Parse(ToString()) is the same value), which is what the config hash relies on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "webhook/quantity.h"

using kvoffload::webhook::Quantity;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto q = Quantity::Parse(text);
  if (!q.ok()) return 0;
  auto again = Quantity::Parse(q.value().ToString());
  if (!again.ok() || !(again.value() == q.value())) std::abort();
  (void)q.value().Value();
  return 0;
}
