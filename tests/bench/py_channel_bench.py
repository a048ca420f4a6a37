#!/usr/bin/python3
"""1 GiB from one Python rank to another (two ranks under launch) through muster's channel,
beside `cp` of the same bytes and torch.save on one rank + torch.load on the other through the
same directory, measured in one run, taking turns. Each is timed from the sender's start to
the receiver holding the tensor (the channel's checksum checked); the channel runs with
python3-xxhash and with the fallback checksum (libxxhash through ctypes).

  tests/bench/py_channel_bench.py [--mib 1024] [--reps 5] [--dir DIR] [--build BUILD]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))


METHODS = ("channel", "channel-ctypes", "cp", "torch")


def worker(mib, reps, work):
    """One rank of the benchmark's job: rank 0 sends, rank 1 receives; the methods take turns
    (a shared machine drifts), after one warm-up turn each (a VM's first touch of fresh
    memory is slow). Rank 1 prints "METHOD SECONDS" per turn."""
    import torch

    import muster
    from muster import checksum
    c = muster.Channel()
    s = muster.store()
    elements = mib * (1 << 20) // 4
    t = torch.arange(elements, dtype=torch.int32) if c.rank == 0 else None
    src, dst = os.path.join(work, "src.bin"), os.path.join(work, "dst.bin")
    if c.rank == 0:
        with open(src, "wb") as f:
            f.write(t.numpy().tobytes())
    for turn in range(reps + 1):
        for method in METHODS:
            c.all_gather_bytes(b"ready")  # both ranks at the start line
            key = f"bench/{turn}/{method}"
            if method.startswith("channel"):
                os.environ["MUSTER_CHECKSUM_IMPL"] = "libxxhash" if "ctypes" in method else "xxhash"
                checksum._impl = None
            if c.rank == 0:
                start = time.time()
                s.set(key + "/t0", repr(start).encode())
                if method.startswith("channel"):
                    c.send(t, 1)
                elif method == "torch":
                    path = os.path.join(work, f"t{turn}.pt")
                    torch.save(t, path)  # then its path to the other rank
                    s.set(key + "/path", path.encode())
                else:
                    subprocess.run(["cp", src, dst], check=True)
                    s.set(key + "/t1", repr(time.time()).encode())
                    os.unlink(dst)
                continue
            if method.startswith("channel"):
                got = c.recv(0)
                end = time.time()
            elif method == "torch":
                path = s.get(key + "/path").decode()
                got = torch.load(path)
                end = time.time()
                os.unlink(path)  # as the channel's receiver does
            else:
                got, end = None, float(s.get(key + "/t1"))
            if got is not None and (got.numel() != elements or got[-1].item() != elements - 1):
                raise SystemExit(f"{method}: the tensor arrived wrong")
            del got
            if turn > 0:
                print(f"{method} {end - float(s.get(key + '/t0')):.6f}", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the files go (default: under $TMPDIR)")
    p.add_argument("--build", default=os.environ.get("MUSTER_BUILD_DIR",
                                                     os.path.join(SOURCE, "build")))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.mib, args.reps, args.worker)
    work = tempfile.mkdtemp(prefix="muster-pybench-", dir=args.dir)
    try:
        env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"),
                   PYTHONDONTWRITEBYTECODE="1")
        run = subprocess.run(
            [os.path.join(args.build, "launcher", "launch"), "--nproc_per_node=2",
             "--master_port=0", "--shared_dir", work, "--no_python", "/usr/bin/python3",
             os.path.abspath(__file__), "--worker", work, "--mib", str(args.mib), "--reps",
             str(args.reps)], env=env, capture_output=True, text=True, timeout=3600)
        if run.returncode != 0:
            sys.exit(f"py_channel_bench: the job failed:\n{run.stderr}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    times = {m: [] for m in METHODS}
    for line in run.stdout.splitlines():
        method, _, secs = line.partition(" ")
        if method in times:
            times[method].append(float(secs))
    import torch
    names = {"channel": "channel (python3-xxhash)",
             "channel-ctypes": "channel (libxxhash via ctypes)",
             "cp": "cp of the same bytes",
             "torch": f"torch.save -> torch.load ({torch.__version__})"}
    gib = args.mib / 1024
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"{args.mib} MiB from rank 0 to rank 1, median of {args.reps} turns, files in "
          f"{os.path.dirname(work)}")
    print(f"{'':44} {'seconds':>8} {'GiB/s':>8}   all turns")
    for m in METHODS:
        print(f"{names[m]:44} {med[m]:8.3f} {gib / med[m]:8.2f}   "
              + " ".join(f"{x:.3f}" for x in times[m]))
    print(f"channel vs cp: {med['cp'] / med['channel']:.2f}x of cp's throughput (goal >= 0.8x)")
    print(f"channel vs torch.save/load: {med['torch'] / med['channel']:.1f}x faster (goal >= 5x)")
    print(f"the ctypes fallback's channel: {med['channel'] / med['channel-ctypes']:.2f}x of "
          "python3-xxhash's throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
