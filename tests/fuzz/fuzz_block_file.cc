// The on-disk block trailer (FORMAT.md): VerifyBlockFile on arbitrary bytes must either accept
// them or say Corruption, never read outside the file. Half the inputs start from a valid file
// (payload from the input) with the input's tail XORed over it, so checksums and the trailer's
// fields are reached, not only the magic.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "block_file.h"

using namespace kvoffload;

namespace {
constexpr size_t kBlockBytes = 4000;  // one 4 KiB file, trailer straddling no page
const BlockKey kFingerprint{0x1111, 0x2222};
const BlockKey kKey{0x3333, 0x4444};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kFile = BlockFileBytes(kBlockBytes);
  // Exactly the file's size: a VerifyBlockFile reading past it is caught by ASan.
  std::vector<std::byte> buf(kFile);
  if (size > 0 && (data[0] & 1) != 0) {
    const size_t n = std::min(size - 1, kBlockBytes);
    std::memcpy(buf.data(), data + 1, n);
    EncodeBlockFile(buf.data(), kBlockBytes, kFingerprint, kKey);
    for (size_t i = 1 + n, j = kBlockBytes; i < size && j < kFile; ++i, ++j) {
      buf[j] ^= static_cast<std::byte>(data[i]);
    }
  } else {
    std::memcpy(buf.data(), data, std::min(size, kFile));
  }
  const Status s = VerifyBlockFile(buf.data(), kBlockBytes, kFingerprint, kKey);
  if (!s.ok() && s.code() != StatusCode::kCorruption) std::abort();
  return 0;
}
