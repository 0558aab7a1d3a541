// CRC-32C (Castagnoli), the checksum of every block on disk, computed by ISA-L (its
// crc32_iscsi picks the fastest kernel the CPU has at run time: interleaved PCLMUL/CRC32
// streams on x86-64, CRC32C instructions on aarch64). Thread-safe (pure).
#ifndef KVOFFLOAD_SRC_CRC32C_H_
#define KVOFFLOAD_SRC_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace kvoffload {

// CRC-32C of data[0, len), continuing from `crc` (0 for a fresh checksum): the standard
// convention (seed and result inverted), so Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const std::byte* data, size_t len, uint32_t crc = 0);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_CRC32C_H_
