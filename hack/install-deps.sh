#!/usr/bin/env bash
# Installs the Debian packages the build, tests and tools need; a no-op when all are present.
# Run as root on Debian 12 (the README's `make test` calls it).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  ccache   # the Makefile's compiler launcher: rebuilds and other clones reuse identical compiles
  libcpp-httplib-dev libssl-dev openssl nlohmann-json3-dev libsimdjson-dev libspdlog-dev libyaml-cpp-dev
  libboost-dev   # Asio + Beast (header-only): the admission port's event-driven server
  libmimalloc-dev   # the webhook binary's allocator: an admission allocates a DOM of the pod
  liburing-dev libgtest-dev libgmock-dev
  libisal-dev   # ISA-L: CRC-32C of every disk block at hardware speed
  clang libclang-rt-14-dev   # libFuzzer and its sanitizer runtimes (make fuzz)
  python3 python3-yaml python3-pip python3-venv curl jq shellcheck   # pip: CUDA wheels; venv: vLLM
  libnuma1   # vLLM's CPU kernels (vllm/_C*.so) link the system's libnuma; its wheel does not carry it
  python3-dev   # torch.compile (vLLM with tensor parallelism on CPU) builds C++ that includes Python.h
  # The e2e node (e2e/node/): container runtime, CNI plugins, the kubelet's iptables rules.
  containerd runc containernetworking-plugins iptables iproute2
  procps   # pgrep: the node's host side passes signals on to the driver in its namespace
)
# `install-deps.sh bench`: also the limits `make bench` measures against (never `make test`).
if [[ "${1:-}" == bench ]]; then
  packages+=(fio wrk nginx-light valgrind)   # valgrind: callgrind counts an admission's instructions
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root or install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A machine just booted runs apt-daily or unattended-upgrades, which hold apt's locks for a
# while: the install waits for them (DPkg::Lock::Timeout), the list update is tried again.
for try in 1 2 3 4; do
  apt-get update -qq && break
  ((try < 4)) || { echo "install-deps: apt-get update failed" >&2; exit 1; }
  sleep 30
done
apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
