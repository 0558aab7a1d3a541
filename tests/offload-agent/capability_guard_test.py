#!/usr/bin/env python3
"""A test whose capability is missing is reported as not run, with the reason, and fails on CI.

Runs the disk I/O test's io_uring cases under a seccomp filter that refuses io_uring_setup with
EPERM, as container runtimes' default profiles do (Docker's since 25.0): without CI=true they
must be skipped naming io_uring, never passed or failed; with CI=true they must fail.

usage: capability_guard_test.py DISK_IO_TEST_BINARY
"""
import ctypes
import os
import subprocess
import sys

# io_uring_setup has one number on every architecture Linux added it to after 5.1 (x86-64 and
# aarch64 alike).
NR_IO_URING_SETUP = 425
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def refuse_io_uring():
    """Runs in the child before exec: io_uring_setup fails with EPERM, every other call runs."""
    program = (SockFilter * 4)(
        SockFilter(BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        SockFilter(BPF_JEQ_K, 0, 1, NR_IO_URING_SETUP),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        SockFilter(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog = SockFprog(len(program), program)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "installing the seccomp filter")


def run(binary, ci):
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    # The uring instances of the parametrised disk I/O cases (Backends/DiskIoTest.*/uring).
    out = subprocess.run([binary, "--gtest_filter=Backends/DiskIoTest.*/1"], env=env,
                         preexec_fn=refuse_io_uring, capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def main():
    binary = sys.argv[1]
    failures = []
    rc, text = run(binary, ci=False)
    if rc != 0:
        failures.append(f"without CI the cases must be skipped, not fail (exit {rc})")
    if "not run: needs the uring disk I/O backend" not in text:
        failures.append("the skip must name the missing capability")
    if "[  PASSED  ] 0 tests" not in text or "[  SKIPPED ]" not in text:
        failures.append("every case must be reported as skipped, none as passed")
    rc_ci, text_ci = run(binary, ci=True)
    if rc_ci == 0 or "CI must have the uring disk I/O backend" not in text_ci:
        failures.append(f"with CI=true a missing capability must fail (exit {rc_ci})")
    if failures:
        print(text, text_ci, sep="\n---\n")
        for f in failures:
            print("FAIL:", f)
        return 1
    print("capability guard: skipped without CI, failed with CI=true")
    return 0


if __name__ == "__main__":
    sys.exit(main())
