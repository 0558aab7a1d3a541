#!/usr/bin/env bash
# check-aarch64.sh: the block checksum on aarch64 (Grace Hopper hosts), from an x86-64 machine.
#
# ISA-L's crc32_iscsi runs another kernel on aarch64 (the CRC32C and PMULL instructions) than on
# x86-64, so the x86 tests say nothing about it. This builds the same test file
# (tests/offload-agent/crc32c_test.cc: check values, RFC 3720's examples, the bit-by-bit
# definition at every length and alignment, checksums blocks on disk already carry) with
# Debian's aarch64 cross compiler against Debian's arm64 libisal, and runs it under qemu-user,
# whose default CPU has both instructions, and checks in qemu's trace that ISA-L chose the kernel
# that uses them. It proves the checksums agree and the hardware path is taken, not the speed: an
# emulator cannot measure that (bench/RESULTS.md gives x86-64 figures).
#
# Needs root the first time: it installs g++-aarch64-linux-gnu and qemu-user (host packages) and
# adds arm64 to dpkg's architectures so that apt can fetch arm64 packages. libisal and
# googletest for arm64 are only downloaded and unpacked into a private sysroot under the output
# directory, never installed: Debian's libisal-dev is not co-installable across architectures,
# and installing the arm64 one would remove the machine's own.
#   CHECK_AARCH64_DIR  where the sysroot and the binary go (default build/aarch64)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${CHECK_AARCH64_DIR:-${repo}/build/aarch64}"
sysroot="${out}/sysroot"
die() { echo "check-aarch64.sh: error: $*" >&2; exit 1; }

missing=()
for p in g++-aarch64-linux-gnu qemu-user; do
  dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed" || missing+=("${p}")
done
arm_pkgs=(libisal2:arm64 libisal-dev:arm64 libgtest-dev:arm64)
if ((${#missing[@]})) || ! dpkg --print-foreign-architectures | grep -qx arm64; then
  [[ $(id -u) -eq 0 ]] || die "needs root to install ${missing[*]:-nothing} and add the arm64 architecture"
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update -qq || die "apt-get update failed after adding the arm64 architecture"
  if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
      --no-install-recommends "${missing[@]}" >/dev/null \
      || die "installing ${missing[*]} failed"
  fi
fi
if [[ ! -f "${sysroot}/.complete" ]]; then
  rm -rf "${sysroot}" "${out}/debs" && mkdir -p "${sysroot}" "${out}/debs"
  (cd "${out}/debs" && apt-get download -qq "${arm_pkgs[@]}") \
    || die "downloading ${arm_pkgs[*]} failed (apt-get update, with arm64 in dpkg --print-foreign-architectures)"
  for deb in "${out}"/debs/*.deb; do dpkg-deb -x "${deb}" "${sysroot}"; done
  touch "${sysroot}/.complete"
fi
lib="${sysroot}/usr/lib/aarch64-linux-gnu"

# The project's warning set, as errors (CMakeLists.txt's list; the cross build is outside CMake
# because only this file and crc32c.cc are built, against arm64 libraries).
aarch64-linux-gnu-g++ -std=c++20 -O2 -Wall -Wextra -Wpedantic -Wshadow -Wold-style-cast \
  -Wconversion -Wsign-conversion -Werror \
  -I "${repo}/offload-agent/src" -isystem "${sysroot}/usr/include" \
  "${repo}/tests/offload-agent/crc32c_test.cc" "${repo}/offload-agent/src/crc32c.cc" \
  -L "${lib}" -lgtest_main -lgtest -lisal -pthread -o "${out}/crc32c_test" \
  || die "cross-compiling tests/offload-agent/crc32c_test.cc for aarch64 failed"
# -L: the cross toolchain's arm64 C and C++ runtimes; libisal from the private sysroot.
run() { qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH="${lib}" "$@"; }
run "${out}/crc32c_test" --gtest_brief=1 || die "the aarch64 checksum tests failed under qemu-aarch64"
# Which kernel ISA-L chose: qemu's log of the code it translated must hold the CRC32C
# instruction (crc32cx), or the checksum ran a table loop, not at hardware speed.
trace="${out}/crc32c_test.in_asm"
run -d in_asm -D "${trace}" "${out}/crc32c_test" --gtest_filter='*Rfc3720*' >/dev/null \
  || die "the traced aarch64 run failed"
grep -qw crc32cx "${trace}" \
  || die "ISA-L did not run the CRC32C instructions under qemu-aarch64 (no crc32cx in ${trace})"
rm -f "${trace}"
echo "check-aarch64.sh: CRC-32C tests pass on aarch64 with the CRC32C instructions (ISA-L $(ls "${out}"/debs/libisal2_*.deb | sed 's/.*libisal2_\([^_]*\)_.*/\1/'), qemu-aarch64)"
