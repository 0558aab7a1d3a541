// Encoding and verification of block files. Layout of the trailer (little-endian):
//   0 magic "KVOBLK01" | 8 u32 version | 12 u32 trailer bytes | 16 u64 payload bytes |
//   24 fingerprint (hi, lo) | 40 key (hi, lo) | 56 u32 payload crc32c | 60 u32 trailer crc32c
// The trailer checksum covers bytes [0, 60) so a torn trailer is caught before its fields are
// trusted; the payload checksum then covers the data.
#include "block_file.h"

#include <cstring>

#include "crc32c.h"

namespace kvoffload {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'O', 'B', 'L', 'K', '0', '1'};
constexpr uint32_t kVersion = 1;

void Put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFU);
}
void Put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFFU);
}
uint32_t Get32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

void EncodeBlockFile(std::byte* buf, size_t block_bytes, const BlockKey& fingerprint,
                     const BlockKey& key) {
  EncodeTrailer(buf, block_bytes, fingerprint, key, Crc32c(buf, block_bytes));
}

void EncodeTrailer(std::byte* buf, size_t block_bytes, const BlockKey& fingerprint,
                   const BlockKey& key, uint32_t payload_crc) {
  std::byte* t = buf + block_bytes;
  std::memset(t, 0, BlockFileBytes(block_bytes) - block_bytes);
  std::memcpy(t, kMagic, sizeof(kMagic));
  Put32(t + 8, kVersion);
  Put32(t + 12, static_cast<uint32_t>(kTrailerBytes));
  Put64(t + 16, block_bytes);
  Put64(t + 24, fingerprint.hi);
  Put64(t + 32, fingerprint.lo);
  Put64(t + 40, key.hi);
  Put64(t + 48, key.lo);
  Put32(t + 56, payload_crc);
  Put32(t + 60, Crc32c(t, 60));
}

uint32_t EncodedPayloadCrc(const std::byte* buf, size_t block_bytes) {
  return Get32(buf + block_bytes + 56);
}

Status VerifyBlockFile(const std::byte* buf, size_t block_bytes, const BlockKey& fingerprint,
                       const BlockKey& key) {
  const std::byte* t = buf + block_bytes;
  if (std::memcmp(t, kMagic, sizeof(kMagic)) != 0) {
    return Status::Corruption("block " + key.ToHex() + ": no trailer (torn or foreign file)");
  }
  if (Get32(t + 60) != Crc32c(t, 60)) {
    return Status::Corruption("block " + key.ToHex() + ": trailer checksum mismatch");
  }
  if (Get32(t + 8) != kVersion || Get32(t + 12) != kTrailerBytes ||
      Get64(t + 16) != block_bytes) {
    return Status::Corruption("block " + key.ToHex() + ": version or block size differs");
  }
  if (BlockKey{Get64(t + 24), Get64(t + 32)} != fingerprint) {
    return Status::Corruption("block " + key.ToHex() + ": written under another model fingerprint");
  }
  if (BlockKey{Get64(t + 40), Get64(t + 48)} != key) {
    return Status::Corruption("block " + key.ToHex() + ": file holds another key");
  }
  if (Get32(t + 56) != Crc32c(buf, block_bytes)) {
    return Status::Corruption("block " + key.ToHex() + ": payload checksum mismatch");
  }
  return Status::Ok();
}

std::string FormatRoot(const std::string& tier_root) { return tier_root + "/" + kFormatDir; }

std::string FingerprintDir(const std::string& tier_root, const BlockKey& fingerprint) {
  return FormatRoot(tier_root) + "/" + fingerprint.ToHex();
}

std::string BlockPath(const std::string& fingerprint_dir, const BlockKey& key) {
  return fingerprint_dir + "/" + key.ToHex() + ".blk";
}

bool ParseHexKey(std::string_view hex, BlockKey* key) {
  if (hex.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t d = 0;
    if (c >= '0' && c <= '9') {
      d = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return false;
    }
    parts[i / 16] = (parts[i / 16] << 4) | d;
  }
  *key = BlockKey{parts[0], parts[1]};
  return true;
}

bool ParseBlockFileName(std::string_view name, BlockKey* key) {
  return name.size() == 36 && name.ends_with(".blk") && ParseHexKey(name.substr(0, 32), key);
}

}  // namespace kvoffload
