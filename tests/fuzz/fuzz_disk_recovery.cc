// The disk tier's recovery scan: a persistent tier directory left in any state (truncated,
// corrupt, misnamed, temp files, another model's blocks) is opened, then every block name in
// it is read. The invariant is the agent's promise: a load that succeeds returns exactly the
// payload a writer stored under that key; everything else is a miss or Corruption.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "block_file.h"
#include "disk_tier.h"
#include "kvoffload/disk_io.h"

using namespace kvoffload;
namespace fs = std::filesystem;

namespace {
constexpr size_t kBlockBytes = 4000;
constexpr size_t kFile = BlockFileBytes(kBlockBytes);
const BlockKey kFingerprint{0xF1F1, 0xF2F2};
const BlockKey kOtherModel{0xE1E1, 0xE2E2};

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buf = std::unique_ptr<std::byte, AlignedFree>;
Buf Alloc() { return Buf(static_cast<std::byte*>(std::aligned_alloc(kBlockAlign, kFile))); }

const std::string& Root() {
  // tmpfs: no O_DIRECT (the probe falls back) and no disk wear from millions of runs.
  static const std::string root = [] {
    char dir[] = "/dev/shm/fuzz-recovery-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    return std::string(dir);
  }();
  return root;
}

void WriteFile(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  std::error_code ec;
  fs::remove_all(Root(), ec);
  const std::string ours = FingerprintDir(Root(), kFingerprint);
  const std::string theirs = FingerprintDir(Root(), kOtherModel);
  fs::create_directories(ours);
  fs::create_directories(theirs);

  // What a correct writer would have stored under each name in our directory (nullopt: the
  // file there is not a block this model wrote, so it must never be served).
  std::map<uint64_t, std::optional<std::vector<std::byte>>> stored;
  const int files = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < files; ++i) {
    const uint64_t name_key = in.ConsumeIntegralInRange<uint64_t>(0, 15);
    const uint8_t kind = in.ConsumeIntegral<uint8_t>();
    const bool foreign = (kind & 0x80) != 0;
    const std::string dir = foreign ? theirs : ours;
    std::vector<std::byte> bytes;
    std::optional<std::vector<std::byte>> payload;
    switch (kind % 4) {
      case 0: {  // a whole valid block, its payload from the input
        bytes.resize(kFile);
        auto p = in.ConsumeBytes<std::byte>(in.ConsumeIntegralInRange<size_t>(0, kBlockBytes));
        if (!p.empty()) std::memcpy(bytes.data(), p.data(), p.size());
        EncodeBlockFile(bytes.data(), kBlockBytes, foreign ? kOtherModel : kFingerprint,
                        BlockKey{0, name_key});
        payload.emplace(bytes.begin(), bytes.begin() + kBlockBytes);
        break;
      }
      case 1: {  // a valid block with bytes flipped (torn write, bit rot) or for another key
        bytes.resize(kFile);
        EncodeBlockFile(bytes.data(), kBlockBytes, kFingerprint,
                        BlockKey{0, in.ConsumeIntegralInRange<uint64_t>(0, 15)});
        for (int flips = in.ConsumeIntegralInRange<int>(0, 4); flips > 0; --flips) {
          bytes[in.ConsumeIntegralInRange<size_t>(0, kFile - 1)] ^=
              static_cast<std::byte>(in.ConsumeIntegral<uint8_t>());
        }
        break;
      }
      case 2:  // arbitrary bytes, arbitrary length (truncated files among them)
        bytes = in.ConsumeBytes<std::byte>(in.ConsumeIntegralInRange<size_t>(0, kFile + 64));
        break;
      default: {  // a temp file left by a crash, or a stranger
        const std::string n = in.ConsumeRandomLengthString(40);
        if (n.empty() || n.find('/') != std::string::npos || n == "." || n == "..") continue;
        WriteFile(fs::path(dir) / (n + ((kind & 0x40) != 0 ? ".tmp" : "")),
                  in.ConsumeBytes<std::byte>(64));
        continue;
      }
    }
    // A damaged or random file that still verifies for its name (as likely as a CRC collision)
    // holds, as far as any reader can know, what was written; anything else must not be served.
    if (kind % 4 != 0 && bytes.size() == kFile &&
        VerifyBlockFile(bytes.data(), kBlockBytes, kFingerprint, BlockKey{0, name_key}).ok()) {
      payload.emplace(bytes.begin(), bytes.begin() + kBlockBytes);
    }
    WriteFile(BlockPath(dir, BlockKey{0, name_key}), bytes);
    if (!foreign) stored[name_key] = std::move(payload);
  }

  DiskTierOptions options;
  options.name = "fuzz";
  options.config = DiskTierConfig{Root(), "pvcRef", 16 * kFile, /*persistent=*/true,
                                  /*shared=*/in.ConsumeBool()};
  options.block_bytes = kBlockBytes;
  options.fingerprint = kFingerprint;
  auto io = NewDiskIo("psync", DiskIoOptions{});
  if (!io.ok()) std::abort();
  auto tier = DiskTier::Open(options, std::move(io).value());
  if (!tier.ok()) return 0;  // refusing a directory is allowed; serving garbage is not

  Buf dst = Alloc();
  for (const auto& [name_key, payload] : stored) {
    const BlockKey key{0, name_key};
    if (!tier.value()->Contains(key)) continue;
    Status pin[1];
    tier.value()->Pin({&key, 1}, pin);
    if (!pin[0].ok()) continue;
    Status read[1];
    std::byte* const dsts[1] = {dst.get()};
    tier.value()->ReadPinned({&key, 1}, dsts, read);
    if (!read[0].ok()) continue;
    // Served: it must be what was written for this key, byte for byte.
    if (!payload.has_value() || std::memcmp(dst.get(), payload->data(), kBlockBytes) != 0) {
      std::abort();
    }
  }
  return 0;
}
