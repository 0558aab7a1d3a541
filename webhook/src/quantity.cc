#include "webhook/quantity.h"

#include <array>
#include <cstdint>
#include <limits>

namespace kvoffload::webhook {
namespace {

using i128 = Int128;

constexpr i128 kNanosPerUnit = 1'000'000'000;
// The largest magnitude we accept: INT64_MAX whole units.
constexpr i128 kMaxNanos = static_cast<i128>(std::numeric_limits<int64_t>::max()) * kNanosPerUnit;
// Bound for intermediate mantissas: far below the i128 limit so one more *10 never overflows.
constexpr i128 kMantissaLimit = kMaxNanos * 1000;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

struct Suffix {
  Quantity::Format format;
  int base;      // 2 or 10
  int exponent;  // power of `base`
};

// Interprets the suffix the way resource.Quantity does; false when it is not one.
bool InterpretSuffix(std::string_view s, Suffix* out) {
  struct Entry {
    std::string_view text;
    Suffix suffix;
  };
  static constexpr std::array<Entry, 16> kTable{{
      {"", {Quantity::Format::kDecimalSI, 10, 0}},
      {"n", {Quantity::Format::kDecimalSI, 10, -9}},
      {"u", {Quantity::Format::kDecimalSI, 10, -6}},
      {"m", {Quantity::Format::kDecimalSI, 10, -3}},
      {"k", {Quantity::Format::kDecimalSI, 10, 3}},
      {"M", {Quantity::Format::kDecimalSI, 10, 6}},
      {"G", {Quantity::Format::kDecimalSI, 10, 9}},
      {"T", {Quantity::Format::kDecimalSI, 10, 12}},
      {"P", {Quantity::Format::kDecimalSI, 10, 15}},
      {"E", {Quantity::Format::kDecimalSI, 10, 18}},
      {"Ki", {Quantity::Format::kBinarySI, 2, 10}},
      {"Mi", {Quantity::Format::kBinarySI, 2, 20}},
      {"Gi", {Quantity::Format::kBinarySI, 2, 30}},
      {"Ti", {Quantity::Format::kBinarySI, 2, 40}},
      {"Pi", {Quantity::Format::kBinarySI, 2, 50}},
      {"Ei", {Quantity::Format::kBinarySI, 2, 60}},
  }};
  for (const Entry& e : kTable) {
    if (e.text == s) {
      *out = e.suffix;
      return true;
    }
  }
  // Decimal exponent: e or E, optional sign, at least one digit.
  if (s.size() >= 2 && (s[0] == 'e' || s[0] == 'E')) {
    std::string_view digits = s.substr(1);
    bool negative = false;
    if (digits[0] == '+' || digits[0] == '-') {
      negative = digits[0] == '-';
      digits.remove_prefix(1);
    }
    if (digits.empty() || digits.size() > 4) return false;
    int exp = 0;
    for (char c : digits) {
      if (!IsDigit(c)) return false;
      exp = exp * 10 + (c - '0');
    }
    *out = {Quantity::Format::kDecimalExponent, 10, negative ? -exp : exp};
    return true;
  }
  return false;
}

i128 Pow10(int n) {
  i128 r = 1;
  for (int i = 0; i < n; ++i) r *= 10;
  return r;
}

// Divides a non-negative magnitude by 10^n, rounding up.
i128 DivPow10RoundUp(i128 v, int n) {
  if (n > 38) return v == 0 ? 0 : 1;
  const i128 d = Pow10(n);
  return v / d + (v % d != 0 ? 1 : 0);
}

std::string I128ToString(i128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  if (negative) v = -v;
  std::string out;
  while (v > 0) {
    out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  if (negative) out.insert(out.begin(), '-');
  return out;
}

}  // namespace

Result<Quantity> Quantity::Parse(std::string_view text) {
  if (text.empty()) return Status::InvalidArgument("empty quantity");
  std::string_view s = text;
  bool negative = false;
  if (s[0] == '+' || s[0] == '-') {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  // Mantissa digits: integer part, optional '.', fraction (either part may be empty, not both).
  size_t pos = 0;
  i128 mantissa = 0;
  int fraction_digits = 0;
  bool any_digit = false;
  bool seen_point = false;
  for (; pos < s.size(); ++pos) {
    const char c = s[pos];
    if (c == '.' && !seen_point) {
      seen_point = true;
      continue;
    }
    if (!IsDigit(c)) break;
    any_digit = true;
    if (mantissa == 0 && c == '0') {
      if (seen_point) ++fraction_digits;
      continue;
    }
    if (mantissa > kMantissaLimit) return Status::InvalidArgument("quantity too large");
    mantissa = mantissa * 10 + (c - '0');
    if (seen_point) ++fraction_digits;
  }
  if (!any_digit) return Status::InvalidArgument("no digits before the suffix");
  Suffix suffix{};
  if (!InterpretSuffix(s.substr(pos), &suffix)) {
    return Status::InvalidArgument("unknown suffix \"" + std::string(s.substr(pos)) +
                                   "\" (use Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or "
                                   "an exponent like e6)");
  }

  // value = mantissa * 10^-fraction_digits * base^exponent; convert to nanos, rounding up.
  int scale = -fraction_digits;  // power of ten still to apply
  if (suffix.base == 2) {
    for (int i = 0; i < suffix.exponent; ++i) {
      mantissa *= 2;
      if (mantissa > kMantissaLimit) return Status::InvalidArgument("quantity too large");
    }
  } else {
    scale += suffix.exponent;
  }
  // nanos = mantissa * 10^(scale + 9)
  const int shift = scale + 9;
  i128 nanos = 0;
  if (shift >= 0) {
    nanos = mantissa;
    for (int i = 0; i < shift && nanos != 0; ++i) {
      nanos *= 10;
      if (nanos > kMaxNanos) return Status::InvalidArgument("quantity too large");
    }
  } else {
    nanos = DivPow10RoundUp(mantissa, -shift);
  }
  if (nanos > kMaxNanos) return Status::InvalidArgument("quantity too large");

  Format format = suffix.format;
  // As the API server: a binary quantity in (0, 1) prints as DecimalSI.
  if (format == Format::kBinarySI && nanos > 0 && nanos < kNanosPerUnit) format = Format::kDecimalSI;
  return Quantity(negative ? -nanos : nanos, format);
}

Quantity Quantity::FromInt(int64_t value, Format format) {
  return Quantity(static_cast<i128>(value) * kNanosPerUnit, format);
}

Result<Quantity> Quantity::Add(const Quantity& other) const {
  const i128 sum = nanos_ + other.nanos_;
  if (sum > kMaxNanos || sum < -kMaxNanos) {
    return Status::InvalidArgument("sum " + ToString() + " + " + other.ToString() + " overflows");
  }
  return Quantity(sum, nanos_ == 0 ? other.format_ : format_);
}

int64_t Quantity::Value() const {
  const i128 magnitude = nanos_ < 0 ? -nanos_ : nanos_;
  const i128 units = DivPow10RoundUp(magnitude, 9);
  return static_cast<int64_t>(nanos_ < 0 ? -units : units);
}

int Quantity::Compare(const Quantity& other) const {
  return nanos_ < other.nanos_ ? -1 : (nanos_ > other.nanos_ ? 1 : 0);
}

std::string Quantity::ToString() const {
  if (nanos_ == 0) return "0";
  Format format = format_;
  const i128 magnitude = nanos_ < 0 ? -nanos_ : nanos_;
  // BinarySI prints only whole values of at least 1024; anything else falls back to DecimalSI
  // so no precision is lost (resource.Quantity.CanonicalizeBytes).
  if (format == Format::kBinarySI &&
      (magnitude < 1024 * kNanosPerUnit || magnitude % kNanosPerUnit != 0)) {
    format = Format::kDecimalSI;
  }
  if (format == Format::kBinarySI) {
    static constexpr std::array<std::string_view, 7> kSuffix{"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
    i128 units = nanos_ / kNanosPerUnit;
    size_t k = 0;
    while (k + 1 < kSuffix.size() && units % 1024 == 0) {
      units /= 1024;
      ++k;
    }
    return I128ToString(units) + std::string(kSuffix[k]);
  }
  // Decimal: mantissa * 10^exponent with exponent a multiple of 3, as large as exactness allows.
  i128 mantissa = nanos_;
  int exponent = -9;
  while (mantissa % 1000 == 0) {
    mantissa /= 1000;
    exponent += 3;
  }
  if (format == Format::kDecimalExponent) {
    return I128ToString(mantissa) + (exponent == 0 ? "" : "e" + std::to_string(exponent));
  }
  std::string_view suffix;
  switch (exponent) {
    case -9: suffix = "n"; break;
    case -6: suffix = "u"; break;
    case -3: suffix = "m"; break;
    case 0: suffix = ""; break;
    case 3: suffix = "k"; break;
    case 6: suffix = "M"; break;
    case 9: suffix = "G"; break;
    case 12: suffix = "T"; break;
    case 15: suffix = "P"; break;
    case 18: suffix = "E"; break;
    default:
      // Unreachable for |value| <= INT64_MAX (10^18 * 9 is the largest), kept total anyway.
      return I128ToString(mantissa) + "e" + std::to_string(exponent);
  }
  return I128ToString(mantissa) + std::string(suffix);
}

}  // namespace kvoffload::webhook
