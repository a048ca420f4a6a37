#!/usr/bin/python3
"""What launch's coordinated stop costs, measured beside its anchors in one run:

  per call   muster.stop_requested(step) in a training loop's place (Python, and the worker
             library's stopRequested() through stop_tool --bench), against the stop flag users
             write today: a Gloo all_reduce of one number every step, in the same two ranks
  the stop   from SIGUSR1 to launch until the last rank has stopped at the common step (4
             Python ranks looping at about 1,000 steps a second), against SIGTERM to launch
             and the same ranks ended as today (forwarded, the job stopped), taking turns

  tests/bench/stop_bench.py [--calls 1000000] [--reps 5] [--build BUILD]
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
PY = "/usr/bin/python3"


def rank_calls(calls):
    """One rank of the per-call job: prints "stop_requested NS", "lock NS", "allreduce NS"."""
    import torch
    import torch.distributed as dist

    import muster
    from muster import stop
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t0 = time.perf_counter_ns()
    for step in range(calls):
        if muster.stop_requested(step):
            break
    per_call = (time.perf_counter_ns() - t0) / calls
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        pass
    empty = (time.perf_counter_ns() - t0) / calls
    # The lock path alone: one locked look at the board per call.
    a = stop._asker
    n = max(calls // 100, 1000)
    t0 = time.perf_counter_ns()
    for i in range(n):
        stop._ask(a, calls + i, 1)
    lock = (time.perf_counter_ns() - t0) / n
    flag = torch.zeros(1)
    n = max(calls // 1000, 200)
    dist.barrier()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        dist.all_reduce(flag)
    allreduce = (time.perf_counter_ns() - t0) / n
    dist.barrier()
    if rank == 0:
        print(f"stop_requested {per_call - empty:.1f}")
        print(f"lock {lock:.1f}")
        print(f"allreduce {allreduce:.1f}")
    dist.destroy_process_group()


def launch(build, args, **kw):
    env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"), PYTHON_EXEC=PY)
    return subprocess.Popen([os.path.join(build, "launcher", "launch"), "--master_port=0", *args], env=env, **kw)


def one_stop(build, work, sig):
    """Seconds from `sig` to launch to the last rank's end (the last .stop file, or launch's exit
    for SIGTERM), and the stop step past the furthest step seen before the notice."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    p = launch(build, ["--nproc_per_node=4", "--no_python", PY, os.path.join(SOURCE, "tests", "python", "stop_worker.py"),
                       "slow", work, "0.001"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            steps = [int(open(os.path.join(work, f"{r}.step")).read()) for r in range(4)]
            if min(steps) >= 200:
                break
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    seen = max(int(open(os.path.join(work, f"{r}.step")).read()) for r in range(4))
    t0 = time.time()
    p.send_signal(sig)
    code = p.wait(timeout=120)
    ended = time.time()
    if sig == signal.SIGUSR1:
        if code != 75:
            raise SystemExit(f"stop_bench: launch exited {code} on SIGUSR1, not 75")
        stops = [open(os.path.join(work, f"{r}.stop")).read().split() for r in range(4)]
        if len({s[0] for s in stops}) != 1:
            raise SystemExit(f"stop_bench: the ranks stopped at different steps: {stops}")
        last = max(os.path.getmtime(os.path.join(work, f"{r}.stop")) for r in range(4))
        return last - t0, ended - t0, int(stops[0][0]) - seen
    return ended - t0, ended - t0, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_calls(args.calls)
        return 0
    build = os.path.abspath(args.build)
    out = subprocess.run([os.path.join(build, "launcher", "launch"), "--master_port=0", "--nproc_per_node=2",
                          "--no_python", PY, os.path.abspath(__file__), "--rank", f"--calls={args.calls}"],
                         env=dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python")),
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"stop_bench: the per-call job failed:\n{out.stdout}{out.stderr}")
    got = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
    tool = subprocess.run([os.path.join(build, "tests", "integration", "stop_tool"), "--bench", str(args.calls * 10)],
                          capture_output=True, text=True, timeout=600)
    if tool.returncode != 0:
        raise SystemExit(f"stop_bench: stop_tool --bench failed:\n{tool.stdout}{tool.stderr}")
    cpp = dict(line.split() for line in tool.stdout.splitlines() if len(line.split()) == 2)
    print("per call (ns), 2 ranks on one node:")
    print(f"  Python stop_requested(step) in a loop: {float(got['stop_requested']):9.1f}")
    print(f"  Python, a locked look at the board:    {float(got['lock']):9.1f}")
    print(f"  C++ stopRequested(step) in a loop:     {float(cpp['stopRequested']):9.1f}")
    print(f"  C++, a locked look at the board:       {float(cpp['lock']):9.1f}")
    print(f"  anchor: Gloo all_reduce of a flag:     {float(got['allreduce']):9.1f}")
    print(f"  ratio stop_requested / all_reduce:     {float(got['stop_requested']) / float(got['allreduce']):9.5f}")
    work = tempfile.mkdtemp(prefix="muster-stopbench-")
    try:
        stops, terms, past = [], [], []
        for _ in range(args.reps):
            last, _, steps = one_stop(build, os.path.join(work, "usr1"), signal.SIGUSR1)
            stops.append(last)
            past.append(steps)
            terms.append(one_stop(build, os.path.join(work, "term"), signal.SIGTERM)[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s, t = statistics.median(stops), statistics.median(terms)
    print(f"notice to the last rank's stop, 4 ranks at ~1,000 steps/s, median of {args.reps}:")
    print(f"  SIGUSR1, one stop step:             {s * 1000:8.1f} ms (steps past the furthest seen: {sorted(past)})")
    print(f"  anchor: SIGTERM, the job ended:     {t * 1000:8.1f} ms")
    print(f"  ratio:                              {s / t:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
