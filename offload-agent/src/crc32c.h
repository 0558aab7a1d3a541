// CRC-32C (Castagnoli), the checksum of every block on disk. SSE4.2 when the CPU has it,
// a table otherwise; both give the same value. Thread-safe (pure).
#ifndef KVOFFLOAD_SRC_CRC32C_H_
#define KVOFFLOAD_SRC_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvoffload {

// CRC-32C of data[0, len), continuing from `crc` (0 for a fresh checksum).
uint32_t Crc32c(const std::byte* data, size_t len, uint32_t crc = 0);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_CRC32C_H_
