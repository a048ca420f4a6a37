"""What every rank sees under launch and under the reference torchrun of one torch, flag by
flag, side by side: each case runs tests/compat/env_dump.py by that torchrun and by launch with
the same flags (both spellings, PET_* variables, the single-node defaults), and compares each
rank's environment, arguments and working directory.

Run by with_torch.sh (MUSTER_TEST_PYTHON, MUSTER_TEST_TORCHRUN, MUSTER_TEST_LEGACY,
MUSTER_TEST_TORCH). usage: env_parity.py LAUNCH [CASE...]. Prints one line per case and every
difference; exit 1 when any case differs.

What may differ, and how it is checked instead:
  MASTER_PORT            the port each run was given, or a free one (>0, the same on every rank)
  TORCHELASTIC_RUN_ID    a uuid-shaped id where torchrun makes one, else the same
  TORCHELASTIC_ERROR_FILE  the same layout below the log folder (run id and random part aside)
  PYTHONPATH             launch puts its stack hook first; the rest the same
  MUSTER_*               launch's own (worker library, stacks, store): only under launch
  PYTHON_EXEC            given to launch only (it names the Python with this torch)

launch gets MUSTER_TEST_LAUNCH_FLAGS (--torchrun_version for a torch older than its default).
Differences launch keeps on purpose are printed as "kept:" with the reason (KEPT).
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_support import PY, MAJOR_MINOR, free_port, launch_argv, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.path.join(HERE, "env_dump.py")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# Differences launch keeps on purpose: (variable, applies to this torch, why).
KEPT = [
    ("TORCHELASTIC_USE_AGENT_STORE", lambda c: MAJOR_MINOR < (2, 6) and (
        "--standalone" in c["flags"] or "--rdzv_backend=c10d" in c["flags"]),
     "launch's c10d rendezvous serves the workers' store from the agent, as torchrun 2.x does; "
     "under torchrun 1.13 rank 0's worker hosts it, and a rank 0 that finishes first takes it "
     "away from the others"),
]


def case(name, flags, env=None, program=None, since=(1, 13), until=None, ranks=2, legacy=None):
    return dict(name=name, flags=flags, env=env or {}, program=program, since=since, until=until,
                ranks=ranks, legacy=legacy)


# {port}: a free port for each run; {log}: a log folder for each run; {py}: MUSTER_TEST_PYTHON.
CASES = [
    case("port", ["--nproc_per_node=2", "--master_port={port}"]),
    case("nodes", ["--nnodes=1", "--node_rank=0", "--nproc_per_node=2",
                   "--master_addr=127.0.0.1", "--master_port={port}"]),
    case("standalone", ["--standalone", "--nproc_per_node=2"]),
    case("c10d_free_port", ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
                            "--nproc_per_node=2"]),
    case("c10d_run_id", ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
                         "--rdzv_id=job7", "--nproc_per_node=2"]),
    case("role_restarts", ["--nproc_per_node=2", "--master_port={port}", "--role=trainer",
                           "--max_restarts=3"]),
    case("module", ["--nproc_per_node=2", "--master_port={port}", "-m"],
         env={"PYTHONPATH": HERE}, program=["env_dump"]),
    case("no_python", ["--nproc_per_node=2", "--master_port={port}", "--no_python"],
         program=["{py}", DUMP]),
    case("pet", [], env={"PET_NPROC_PER_NODE": "2", "PET_MASTER_PORT": "{port}",
                         "PET_MAX_RESTARTS": "1", "PET_ROLE": "pet"}),
    case("logs", ["--nproc_per_node=2", "--master_port={port}", "--log_dir={log}",
                  "--redirects=3", "--tee=1"]),
    case("nproc_cpu", ["--nproc_per_node=cpu", "--master_port={port}"], ranks=os.cpu_count()),
    case("omp_given", ["--nproc_per_node=2", "--master_port={port}"],
         env={"OMP_NUM_THREADS": "3"}),
    case("one_rank", ["--nproc_per_node=1", "--master_port={port}"], ranks=1),
    case("agent_store_off", ["--standalone", "--nproc_per_node=2"],
         env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, since=(2, 4)),
    case("dashes", ["--nproc-per-node=2", "--master-port={port}", "--max-restarts=1",
                    "--rdzv-id=dash", "--node-rank=0", "--master-addr=127.0.0.1"], since=(2, 0)),
    case("local_addr", ["--standalone", "--nproc-per-node=2", "--local-addr=127.0.0.1"],
         since=(2, 4)),
    case("virtual_local_rank", ["--nproc-per-node=2", "--master-port={port}",
                                "--virtual-local-rank"], env={"CUDA_VISIBLE_DEVICES": "4,6"},
         since=(2, 9)),
    # Flags that change no variable: accepted with the same meaning, and the ranks see the same.
    case("quiet_flags", ["--nproc_per_node=2", "--master_port={port}", "--monitor_interval=0.5",
                         "--start_method=fork", "--rdzv_conf=timeout=30", "--log_dir={log}",
                         "--max_restarts=0"]),
    case("quiet_flags_2x", ["--nproc-per-node=2", "--master-port={port}", "--monitor-interval=1",
                            "--start-method=spawn", "--local-ranks-filter=0", "--tee=3",
                            "--log-dir={log}"],
         since=(2, 4)),
    case("flags_2_14", ["--nproc-per-node=2", "--master-port={port}",
                        "--signals-to-handle=SIGTERM,SIGUSR1", "--shutdown-timeout=5",
                        "--log-line-prefix-template=[${role_name}${rank}]:",
                        "--event-log-handler=null"],
         since=(2, 14)),
    # torchrun's default on one node: static on 127.0.0.1:29500 before 2.14 (not run here, as
    # 29500 may be another test's), c10d on a free port from 2.14.
    case("default", ["--nproc_per_node=2"], since=(2, 14)),
    case("legacy", ["--nproc_per_node=2", "--master_port={port}"], legacy=True),
]


def run(argv, env, what):
    started = time.monotonic()
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=240)
    if p.returncode != 0:
        raise RuntimeError(f"{what} exited {p.returncode}: {shlex.join(argv)}\n"
                           + p.stdout.decode(errors="replace")[-3000:])
    return time.monotonic() - started


def expand(items, port, log, py=PY):
    return [x.replace("{port}", str(port)).replace("{log}", log).replace("{py}", py)
            for x in items]


def one_side(c, who, launch, work):
    out = os.path.join(work, who)
    log = os.path.join(work, who + "-logs")
    os.makedirs(out)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env.pop("OMP_NUM_THREADS", None)
    env.update({k: expand([v], port, log)[0] for k, v in c["env"].items()})
    flags = expand(c["flags"], port, log)
    # The reference runs in its torch's root (when there is one), where that Python is python3.
    py = "/usr/bin/python3" if who == "torch" else PY
    program = expand(c["program"] or [DUMP], port, log, py) + [out]
    if who == "torch":
        ref = os.environ["MUSTER_TEST_LEGACY" if c["legacy"] else "MUSTER_TEST_TORCHRUN"]
        argv = ref.split() + flags + program
    else:
        env["PYTHON_EXEC"] = PY
        argv = launch_argv(launch, flags + program)
        if c["legacy"]:
            argv.insert(1, "--legacy_launch=" + ("1.13" if MAJOR_MINOR < (2, 0) else "2"))
    run(argv, env, who)
    ranks = {}
    for rank in range(c["ranks"]):
        path = os.path.join(out, f"{rank}.json")
        if not os.path.exists(path):
            raise RuntimeError(f"{who}: rank {rank} wrote nothing")
        ranks[rank] = json.load(open(path))
    return ranks, port, log, out


def compare(c, theirs, ours):
    (t_ranks, t_port, t_log, t_out), (o_ranks, o_port, o_log, o_out) = theirs, ours
    diffs, kept = [], set()
    ports = {"torch": set(), "launch": set()}
    for rank in t_ranks:
        t, o = t_ranks[rank], o_ranks[rank]
        te, oe = t["env"], o["env"]
        keys = set(te) | set(oe)
        for key in sorted(keys):
            tv, ov = te.get(key), oe.get(key)
            if key.startswith("MUSTER_") or key == "PYTHON_EXEC" or key in c["env"]:
                continue
            if tv == ov:
                continue
            if key == "MASTER_PORT":
                ports["torch"].add(tv)
                ports["launch"].add(ov)
                if str(t_port) in (tv,) and ov == str(o_port):
                    continue
                if tv and ov and tv.isdigit() and ov.isdigit() and int(ov) > 0:
                    continue
            elif key == "TORCHELASTIC_RUN_ID" and tv and ov and UUID.match(tv):
                if UUID.match(ov):
                    continue
            elif key == "TORCHELASTIC_ERROR_FILE" and tv and ov:
                def suffix(path):
                    return re.sub(r"^.*/attempt_", "attempt_", path)
                # Under --log_dir, each run's file lies in its own log folder.
                in_log = not any(f.startswith(("--log_dir", "--log-dir")) for f in c["flags"]) \
                    or (tv.startswith(t_log + "/") and ov.startswith(o_log + "/"))
                if suffix(tv) == suffix(ov) and in_log:
                    continue
            elif key == "PYTHONPATH" and ov and tv is not None and ov.endswith(tv):
                continue
            why = next((w for k, applies, w in KEPT if k == key and applies(c)), None)
            if why:
                kept.add(f"{key} ({why})")
                continue
            diffs.append(f"rank {rank}: {key}: launch {ov!r}, torchrun {tv!r}")
        targv = [a.replace(t_out, "OUT") for a in t["argv"]]
        oargv = [a.replace(o_out, "OUT") for a in o["argv"]]
        if targv != oargv:
            diffs.append(f"rank {rank}: argv: launch {oargv}, torchrun {targv}")
        if t["cwd"] != o["cwd"]:
            diffs.append(f"rank {rank}: cwd: launch {o['cwd']}, torchrun {t['cwd']}")
    for who, seen in ports.items():
        if len(seen) > 1:
            diffs.append(f"{who}: ranks saw different MASTER_PORTs {sorted(seen)}")
    return diffs, kept


def main():
    return run_cases(CASES, one_side, compare, "muster-env-")


if __name__ == "__main__":
    sys.exit(main())
