// Kubernetes resource quantities ("10Gi", "500m", "1e3") with the API server's semantics:
// exact fixed-point arithmetic in nano units, values rounded up to 1n as ParseQuantity does,
// canonical output as Quantity.String() prints it. Overflow past int64 (in whole units) is an
// error instead of the API server's silent cap. Value type; thread-compatible.
#ifndef KVOFFLOAD_WEBHOOK_QUANTITY_H_
#define KVOFFLOAD_WEBHOOK_QUANTITY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kvoffload/status.h"

namespace kvoffload::webhook {

// GCC and clang extension; __extension__ keeps -Wpedantic quiet about it.
__extension__ typedef __int128 Int128;

class Quantity {
 public:
  // How the value prints: the suffix family of the string it was parsed from.
  enum class Format { kDecimalSI, kBinarySI, kDecimalExponent };

  Quantity() = default;  // zero, DecimalSI

  // Parses `text` ("100Gi", "1.5G", "500m", "12e6", "+1Ki"). The error message says what is
  // wrong with the text; callers prefix the field path.
  static Result<Quantity> Parse(std::string_view text);
  // Whole units, e.g. bytes for storage. REQUIRES: value >= 0 is not required; sub-unit
  // remainders round up (away from zero), as resource.Quantity.Value() does.
  static Quantity FromInt(int64_t value, Format format);

  // Exact sum. Format: the receiver's, or the addend's when the receiver is zero (as
  // resource.Quantity.Add). Overflow is an error.
  Result<Quantity> Add(const Quantity& other) const;

  // Whole units, rounded up (resource.Quantity.Value()).
  int64_t Value() const;
  int Sign() const { return nanos_ > 0 ? 1 : (nanos_ < 0 ? -1 : 0); }
  bool IsZero() const { return nanos_ == 0; }
  // Whether it is a whole number of units (no milli, micro or nano part).
  bool IsWhole() const { return nanos_ % 1'000'000'000 == 0; }
  Format format() const { return format_; }
  // -1, 0, 1.
  int Compare(const Quantity& other) const;

  // The canonical string ("1536Mi", "1500", "500m", "12e6").
  std::string ToString() const;

 private:
  Quantity(Int128 nanos, Format format) : nanos_(nanos), format_(format) {}
  Int128 nanos_ = 0;  // value * 10^9; |nanos_| <= INT64_MAX * 10^9
  Format format_ = Format::kDecimalSI;
};

inline bool operator==(const Quantity& a, const Quantity& b) { return a.Compare(b) == 0; }
inline bool operator<(const Quantity& a, const Quantity& b) { return a.Compare(b) < 0; }

}  // namespace kvoffload::webhook

#endif  // KVOFFLOAD_WEBHOOK_QUANTITY_H_
