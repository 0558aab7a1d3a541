#!/usr/bin/env python3
"""`kvoffload-bench disk` in each tier state on a small pass: the bench measures what its
report says it does. Empty: nothing is evicted from disk. Full: every timed store evicts.
Mixed: every load is served from disk while the stores evict, and as many of each as asked.
The figures themselves are `make bench`'s; here only the shape of the run is checked. Also
the numbers its flags take, which every subcommand reads the same way.

usage: disk_states_test.py KVOFFLOAD_BENCH SCRATCH_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import unittest

BENCH, SCRATCH = sys.argv[1], sys.argv[2]
QD = 4
BLOCKS = 128  # the smallest pass the mixed state runs at QD 4 (32 x QD)


def disk(*flags, blocks=BLOCKS):
    out = subprocess.run([BENCH, "disk", f"--dir={SCRATCH}", "--block-size=64K", f"--qd={QD}",
                          f"--total={blocks * 64}K", *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return out


class DiskStatesTest(unittest.TestCase):
    def setUp(self):
        shutil.rmtree(SCRATCH, ignore_errors=True)
        os.makedirs(SCRATCH)

    def run_state(self, *flags, blocks=BLOCKS):
        out = disk(*flags, blocks=blocks)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        self.assertEqual(got["blocks"], blocks)
        for key in ("failed_loads", "failed_stores", "io_errors"):
            self.assertEqual(got[key], 0, key)
        return got

    def test_empty_tier_evicts_nothing(self):
        got = self.run_state("--state=empty")
        self.assertEqual(got["disk_evictions_during_store"], 0)
        # The untimed warm loads and the timed ones read every block once, all from disk.
        self.assertEqual(got["disk_bytes_read"], BLOCKS * 64 * 1024)

    def test_full_tier_evicts_on_every_store(self):
        # A pass of 1024 blocks: the pinned tier's 4 x QD is a 64th of it, so a tier sized by
        # the pinned slot (payload and trailer) instead of the disk slot (payload), a 16th
        # larger, would have room left after the fill, and its first 48 timed stores would
        # evict nothing.
        blocks = 1024
        got = self.run_state("--state=full", blocks=blocks)
        # Every timed store pushes one block down, and the tier holds exactly one pass, so each
        # of them evicts one from disk: all but the demoter's last batches, which may still be
        # on their way when the stores end (up to 2 x QD).
        self.assertGreaterEqual(got["disk_evictions_during_store"], blocks - 2 * QD)
        # Counted by the disk slot's size: all the blocks that reached the disk but the few
        # still pinned when the stores end (by the pinned slot's size, 16 of every 17).
        self.assertGreaterEqual(got["disk_blocks_written"], blocks - 4 * QD)
        self.assertLessEqual(got["disk_blocks_written"], blocks + 4 * QD)

    def test_mixed_loads_come_from_disk_while_stores_evict(self):
        got = self.run_state("--state=mixed")
        self.assertEqual(got["stores"], BLOCKS)
        self.assertEqual(got["loads"], BLOCKS)
        # Each load reads a block stored a quarter of a tier earlier: on disk, not pinned. On a
        # busy machine the demoter can trail the stores, and a load then finds its block still
        # pinned while the write of it is under way (127 of 128 with the engine tests beside
        # it): up to one demoter batch (QD).
        self.assertGreaterEqual(got["disk_blocks_read"], BLOCKS - QD)
        self.assertLessEqual(got["disk_blocks_read"], BLOCKS)
        self.assertGreaterEqual(got["disk_blocks_written"], BLOCKS - 4 * QD)
        self.assertGreaterEqual(got["disk_evictions"], BLOCKS - 4 * QD)

    def test_mixed_refuses_job_shapes_it_does_not_run(self):
        out = disk("--state=mixed", "--load-batch=8")
        self.assertEqual(out.returncode, 2)
        self.assertIn("--load-batch", out.stderr)
        self.assertIn("--state=mixed", out.stderr)


class FlagsTest(unittest.TestCase):
    """A size or count the bench cannot read whole is refused naming the flag (exit 2), never
    read as another number: "2Mi" was 2 bytes, "1.5M" 1 MiB, "-1M" 2^64 - 1 MiB, and a block
    size of 0 divided by zero."""

    def test_bad_numbers_name_the_flag(self):
        for cmd, flag, value in (("cpu", "block-size", "0"), ("cpu", "total", "2Mi"),
                                 ("cpu", "total", "1.5M"), ("cpu", "total", "-1M"),
                                 ("disk", "total", "99999999999T"), ("cpu", "reps", "-1"),
                                 ("cpu", "reps", "3x")):
            with self.subTest(cmd=cmd, flag=flag, value=value):
                args = [BENCH, cmd, f"--{flag}={value}"] + ([f"--dir={SCRATCH}"] if cmd == "disk"
                                                            else [])
                out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, timeout=60)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertIn(f"--{flag}={value}: want a whole number", out.stderr)
                self.assertEqual(out.stdout, "")

    def test_cache_sizes_are_read_whole_or_refused(self):
        """--cache-blocks of the trace replay: "1e19" died with a C++ exception, "inf" and
        10^20 were replayed as a 1-block cache under their own label, "0x10" was 16; and a
        count far above the trace's blocks took memory by the count (10^10 blocks for 9)."""
        trace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata",
                             "mooncake_shape.jsonl")

        def replay(sizes, path=trace):
            return subprocess.run([BENCH, "trace", f"--trace-file={path}",
                                   f"--cache-blocks={sizes}", "--policies=lru"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  timeout=60)

        for value in ("99999999999999999999", "inf", "1e19", "0x10", " 3", "1e3", "1.5", "0",
                      "-1", "150%", "nan%", "2%x"):
            with self.subTest(value=value):
                out = replay(value)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertIn(f'--cache-blocks: "{value}" is not a block count', out.stderr)
                self.assertEqual(out.stdout, "")
        out = replay("10000000000,9,2.5%")
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        held = [(r["cache"], r["cache_blocks"]) for r in got["results"]]
        self.assertEqual(held, [("10000000000", got["distinct_blocks"]),
                                ("9", 9), ("2.5%", 1)])
        self.assertEqual(got["results"][0]["lru"], got["results"][1]["lru"])
        empty = os.path.join(SCRATCH, "empty.jsonl")
        os.makedirs(SCRATCH, exist_ok=True)
        with open(empty, "w", encoding="utf-8") as f:
            f.write('{"hash_ids": []}\n{"hash_ids": []}\n')
        out = replay("5%", empty)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("holds no block", out.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
