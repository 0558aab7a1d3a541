// CRC-32C through ISA-L, in the convention blocks have always been written with.
#include "crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace kvoffload {

uint32_t Crc32c(const std::byte* data, size_t len, uint32_t crc) {
  // crc32_iscsi neither inverts its seed nor its result (iSCSI framing does that itself), so
  // the standard CRC-32C, and continuing one, is ~crc32_iscsi(data, len, ~crc).
  crc = ~crc;
  // Its length is an int: larger buffers go in pieces (a block is far smaller, but a caller
  // may checksum a whole file).
  constexpr size_t kMaxPiece = size_t{1} << 30;
  while (len > 0) {
    const size_t n = std::min(len, kMaxPiece);
    // It takes a non-const pointer but only reads the buffer.
    crc = crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<std::byte*>(data)),
                      static_cast<int>(n), crc);
    data += n;
    len -= n;
  }
  return ~crc;
}

}  // namespace kvoffload
