#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Benchmark of the Python package and the wheel (issue #29); run by bench/run.sh as bin/bench_python
(configured from bench/bench_python.py). Prints on stdout:
  python_load_top_1gb_s       `python3 -c "memsnap.load(path).top()"` on the 1 GB synthetic pickle
                              (bench/synth.h, as bench_read's: gen_snapshot's default), CPU time
                              (user + system) of the interpreter and the program it runs, median of 3
  python_load_top_1gb_cli_s   the baseline in the same run, alternating: `memsnap top FILE`
  python_load_top_1gb_ratio   the first over the second (target <= 1.10)
  wheel_mb                    the wheel scripts/wheel.py makes from this (Release) tree, in MB
Each line on stderr shows the wall-clock times too. Environment: MS_BENCH_READ_KEEP (a path: the
synthetic is written there, kept and reused), MS_BENCH_PICKLE_SCALE (a fraction of the 5,000,000
entries).
"""
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SOURCE = "@PROJECT_SOURCE_DIR@"
BUILD = "@PROJECT_BINARY_DIR@"
REPS = 3


def child_cpu(argv, env=None):
    """(CPU seconds of argv and its descendants, wall seconds)."""
    r0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=env)
    r1, w1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), w1 - w0


def main():
    binary = os.path.join(BUILD, "bin", "memsnap")
    tmp = tempfile.mkdtemp(prefix="memsnap-bench-python-")
    keep = os.environ.get("MS_BENCH_READ_KEEP")
    path = keep or os.path.join(tmp, "synthetic.pickle")
    try:
        if not os.path.exists(path):
            scale = float(os.environ.get("MS_BENCH_PICKLE_SCALE") or 1)
            subprocess.run([os.path.join(BUILD, "bin", "gen_snapshot"), "-o", path,
                            "--entries", str(max(1000, int(5e6 * scale)))], check=True)
        mb = os.path.getsize(path) / 1e6
        env = dict(os.environ, MEMSNAP_PREFIX=BUILD, PYTHONPATH=os.path.join(SOURCE, "python"))
        py = [sys.executable, "-c", "import memsnap, sys; memsnap.load(sys.argv[1]).top()", path]
        cli = [binary, "top", path, "-n", "20"]
        pys, clis = [], []
        for _ in range(REPS):  # alternating, so that the machine's load falls on both alike
            clis.append(child_cpu(cli))
            pys.append(child_cpu(py, env))
        p = statistics.median(c for c, _ in pys)
        c = statistics.median(c for c, _ in clis)
        print(f"bench_python: {mb:.0f} MB pickle: load().top() {p:.2f} s CPU (wall "
              f"{', '.join(f'{w:.2f}' for _, w in pys)}), memsnap top {c:.2f} s CPU (wall "
              f"{', '.join(f'{w:.2f}' for _, w in clis)}): ratio {p / c:.3f}", file=sys.stderr)
        print(f"python_load_top_1gb_s {p:.3f}")
        print(f"python_load_top_1gb_cli_s {c:.3f}")
        print(f"python_load_top_1gb_ratio {p / c:.4f}")
        subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "wheel.py"), BUILD,
                        os.path.join(tmp, "dist")], check=True, stdout=sys.stderr)
        whl = [f for f in os.listdir(os.path.join(tmp, "dist")) if f.endswith(".whl")][0]
        print(f"wheel_mb {os.path.getsize(os.path.join(tmp, 'dist', whl)) / 1e6:.2f}")
    finally:
        if not keep and os.path.exists(path):
            os.remove(path)
        subprocess.run(["rm", "-rf", tmp], check=False)


if __name__ == "__main__":
    main()
