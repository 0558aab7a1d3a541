// The on-disk block format (FORMAT.md): payload, then a 64-byte trailer with checksums, padded
// to 4096 so that a block file is written and read with one O_DIRECT transfer from a pinned
// slot. Also the tier directory layout. Thread-safe (pure functions).
#ifndef KVOFFLOAD_SRC_BLOCK_FILE_H_
#define KVOFFLOAD_SRC_BLOCK_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvoffload/block_key.h"
#include "kvoffload/status.h"

namespace kvoffload {

inline constexpr size_t kBlockAlign = 4096;
inline constexpr size_t kTrailerBytes = 64;
inline constexpr char kFormatDir[] = "kvoffload-v1";

inline constexpr size_t RoundUp(size_t n, size_t align) { return (n + align - 1) / align * align; }

// Size of a block file, and of a pinned slot, for blocks of block_bytes.
inline constexpr size_t BlockFileBytes(size_t block_bytes) {
  return RoundUp(block_bytes + kTrailerBytes, kBlockAlign);
}

// Writes the trailer after the payload in buf[0, BlockFileBytes) and zeroes the padding.
// REQUIRES: buf holds BlockFileBytes(block_bytes) bytes with the payload in front.
void EncodeBlockFile(std::byte* buf, size_t block_bytes, const BlockKey& fingerprint,
                     const BlockKey& key);

// The same trailer for a payload whose checksum is already known: a slot file keeps its blocks'
// checksums in memory and puts the trailer back on each block it reads.
void EncodeTrailer(std::byte* buf, size_t block_bytes, const BlockKey& fingerprint,
                   const BlockKey& key, uint32_t payload_crc);
// The payload checksum an encoded trailer carries.
uint32_t EncodedPayloadCrc(const std::byte* buf, size_t block_bytes);

// Corruption (saying what is wrong) unless buf is a whole, intact block file for exactly this
// fingerprint, key and block size.
Status VerifyBlockFile(const std::byte* buf, size_t block_bytes, const BlockKey& fingerprint,
                       const BlockKey& key);

// <root>/kvoffload-v1
std::string FormatRoot(const std::string& tier_root);
// <root>/kvoffload-v1/<fingerprint hex>
std::string FingerprintDir(const std::string& tier_root, const BlockKey& fingerprint);
// <dir>/<key hex>.blk
std::string BlockPath(const std::string& fingerprint_dir, const BlockKey& key);
// Parses "<32 hex>.blk"; false for anything else (temp files, strangers).
bool ParseBlockFileName(std::string_view name, BlockKey* key);
bool ParseHexKey(std::string_view hex, BlockKey* key);

}  // namespace kvoffload

#endif  // KVOFFLOAD_SRC_BLOCK_FILE_H_
