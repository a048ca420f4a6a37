"""torchelastic's own launcher tests with launch in torchrun's place: the cases of PyTorch's
test/distributed/launcher/{run_test,test_run}.py and those of
test/distributed/elastic/agent/server/test/local_elastic_agent_test.py and
elastic/multiprocessing/errors/api_test.py that check what a user of torchrun sees (listed in
docs/pytorch-tests.md), rewritten (elastic_worker.py holds their ranks), each run by that torch's
torchrun and by launch with the same flags and environment, side by side. What is compared:
the exit status, the files the ranks made, what they wrote, and where a case says so, lines of
the console and the launcher's error file.

Run by with_torch.sh. usage: elastic_parity.py LAUNCH [CASE...]; exit 1 when any case differs.
Differences launch keeps on purpose are printed as "kept:" with the reason.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_support import PY, MAJOR_MINOR, TORCHRUN, free_port, launch_argv, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_worker.py")
SCRIPT = "#!/bin/sh\necho \"creating $1/$RANK\"\ntouch \"$1/$RANK\"\n"  # bin/test_script.sh's deed


def case(name, flags, program=None, env=None, since=(1, 13), refused=False, fails=False,
         agents=1, console=None, error_file=False, needs=None, launch_says=None, waits=None):
    """program: elastic_worker.py's MODE and arguments (["touch"] when None), or ["{sh}"] for
    the shell rank of --no_python. refused: bad input, nothing may start; fails: a rank fails.
    agents: how many launchers run the flags, or a list of each one's own extra flags.
    needs: a torchrun flag the case needs, or a probe (parity_support.run_cases).
    console: a regular expression whose matches in the console are compared. launch_says: a
    regular expression launch's console must match where the case is refused (its reason).
    waits: seconds no agent may end before (each waits for the slowest node's ranks)."""
    return dict(name=name, flags=flags, program=program or ["touch"], env=env or {}, since=since,
                refused=refused, fails=fails, agents=agents, console=console, error_file=error_file,
                needs=needs, launch_says=launch_says, waits=waits)


NO_CUDA = "when CUDA shows no device"  # refused where torch.cuda.device_count() is 0
_cuda_counts = {}


def cuda_count(visible):
    """torch.cuda.device_count() of this torch with CUDA_VISIBLE_DEVICES=visible (None: unset)."""
    if visible not in _cuda_counts:
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        done = subprocess.run([PY, "-c", "import torch; print(torch.cuda.device_count())"], env=env,
                              capture_output=True, text=True, timeout=120, check=True)
        _cuda_counts[visible] = int(done.stdout.split()[-1])
    return _cuda_counts[visible]


def refused(c):
    if c["refused"] == NO_CUDA:
        return cuda_count(c["env"].get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))) == 0
    return c["refused"]


def tensorpipe_missing():
    """Why this torch's RPC cannot start (Debian's 2.14 is built without TensorPipe: its options'
    base class is a bare object), or None."""
    done = subprocess.run([PY, "-c", "import torch.distributed.rpc as r; r.TensorPipeRpcBackendOptions()"],
                          capture_output=True, text=True, timeout=120)
    return None if done.returncode == 0 else "has no TensorPipe RPC (" + \
        (done.stderr.strip().splitlines() or ["?"])[-1] + ")"


C10D = ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:{port}"]
PET = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "4", "PET_RDZV_ID": "pet", "PET_MONITOR_INTERVAL": "1",
       "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1", "PET_MASTER_PORT": "{port}"}

CASES = [
    # run_test.py / test_run.py
    case("user_script_python", ["--nproc_per_node=4", "--master_port={port}", "--monitor_interval=1",
                                "--start_method=spawn"]),
    case("user_script_python_dashes", ["--nproc-per-node=4", "--master-port={port}", "--rdzv-id=dash",
                                       "--monitor-interval=1", "--start-method=spawn"], since=(2, 0)),
    case("caffe2_bc", ["--nnodes=1", "--master_addr=localhost", "--master_port={port}", "--node_rank=0",
                       "--nproc_per_node=4"]),
    case("user_script_bash", ["--nproc_per_node=4", "--master_port={port}", "--no_python"], ["{sh}"]),
    case("module_with_no_python", ["--nproc_per_node=4", "--master_port={port}", "--no_python", "--module"],
         ["{sh}"], refused=True),
    case("default_nproc", ["--master_port={port}", "--no_python"], ["{sh}"]),
    case("env_vars", [], ["{sh}"], env=dict(PET, PET_MODULE="0")),
    case("env_vars_module", [], ["{sh}"], env=dict(PET, PET_MODULE="1"), refused=True),
    case("nproc_auto", ["--nproc_per_node=auto", "--master_port={port}", "--no_python"], ["{sh}"],
         env={"CUDA_VISIBLE_DEVICES": ""}),
    # test_nproc_gpu_launch_configurations with real devices: as many workers as CUDA shows
    # (none: refused), CUDA_VISIBLE_DEVICES read as CUDA reads it (launcher/devices.cc)
    case("nproc_gpu", ["--nproc_per_node=gpu", "--master_port={port}", "--no_python"], ["{sh}"],
         refused=NO_CUDA, launch_says="CUDA shows no GPU here"),
    case("nproc_gpu_visible_beyond", ["--nproc_per_node=gpu", "--master_port={port}", "--no_python"],
         ["{sh}"], env={"CUDA_VISIBLE_DEVICES": "0,1,2"}, refused=NO_CUDA, launch_says="CUDA shows no GPU here"),
    case("nproc_gpu_visible_first_missing", ["--nproc_per_node=gpu", "--master_port={port}", "--no_python"],
         ["{sh}"], env={"CUDA_VISIBLE_DEVICES": "1,0"}, refused=NO_CUDA, launch_says="CUDA shows no GPU here"),
    case("nproc_gpu_visible_repeated", ["--nproc_per_node=gpu", "--master_port={port}", "--no_python"],
         ["{sh}"], env={"CUDA_VISIBLE_DEVICES": "0,0"}, refused=NO_CUDA, launch_says="CUDA shows no GPU here"),
    case("nproc_auto_visible_beyond", ["--nproc_per_node=auto", "--master_port={port}", "--no_python"],
         ["{sh}"], env={"CUDA_VISIBLE_DEVICES": "0,1,2"}),
    case("nproc_unknown", ["--nproc_per_node=unknown", "--master_port={port}", "--no_python"], ["{sh}"],
         refused=True),
    case("elastic", ["--nnodes=1:2", "--nproc_per_node=4", "--max_restarts=0"] + C10D
         + ["--rdzv_conf='join_timeout=5,last_call_timeout=1,timeout=5'"]),
    case("elastic_multiple_agents", ["--nnodes=1:2", "--nproc_per_node=4", "--rdzv_conf=timeout=5"] + C10D,
         agents=2),
    case("elastic_worker_raise_exception", ["--nnodes=1:2", "--nproc_per_node=4", "--max_restarts=0"] + C10D
         + ["--rdzv_conf=join_timeout=5,last_call_timeout=1"], ["touch", "--fail"], fails=True),
    case("standalone", ["--standalone", "--nproc_per_node=4"]),
    case("run_path", ["--run_path", "--nproc_per_node=4", "--master_port={port}"]),
    case("is_torchelastic_launched", ["--run_path", "--nnodes=1", "--nproc_per_node=1", "--master_port={port}"],
         ["launched"]),
    case("is_torchelastic_launched_with_logs_specs", ["--run_path", "--nnodes=1", "--nproc_per_node=1",
                                                      "--master_port={port}", "--logs_specs=default"],
         ["launched"], needs="--logs-specs"),
    case("logs_specs_not_defined", ["--run_path", "--nnodes=1", "--nproc_per_node=1", "--master_port={port}",
                                    "--logs_specs=DOESNOT_EXIST"], ["launched"], refused=True, needs="--logs-specs"),
    case("init_method_tcp", ["--run_path", "--nproc_per_node=4", "--master_addr=localhost",
                             "--master_port={port}"], ["init", "tcp://localhost:{port}"]),
    case("init_method_env", ["--run_path", "--nproc_per_node=4", "--master_addr=localhost",
                             "--master_port={port}"], ["init", "env://"]),
    case("capture_logs_abbreviated", ["--nproc-per-node=4", "--master-port={port}", "--no-python",
                                      "--redirect=3", "--tee=3"], ["{sh}"],
         env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}, since=(2, 6),
         console=r"\[rank\d\]: creating "),
    # local_elastic_agent_test.py
    case("correct_rank_assignment_heterogeneous", ["--nnodes=4", "--master_addr=127.0.0.1", "--master_port={port}"],
         ["env", "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "WORLD_SIZE"],
         agents=[["--node_rank=0", "--role=ps", "--nproc_per_node=2"],
                 ["--node_rank=1", "--role=trainer", "--nproc_per_node=1"],
                 ["--node_rank=2", "--role=trainer", "--nproc_per_node=2"],
                 ["--node_rank=3", "--role=ps", "--nproc_per_node=1"]]),
    # test_workers_drift_*: two nodes end 2 s and 4 s apart; neither fails, and the first waits
    # for the second (torchrun's exit barrier: 300 s, not a flag of torchrun's)
    case("workers_drift_2s", ["--nnodes=2", "--nproc_per_node=1"] + C10D, ["drift", "2"], agents=2, waits=2),
    case("workers_drift_4s", ["--nnodes=2", "--nproc_per_node=1"] + C10D, ["drift", "4"], agents=2, waits=4),
    # test_torch_rpc_*: a rank of the role master calls one of the role worker over torch RPC
    # (TensorPipe, its rendezvous on the launcher's MASTER_ADDR and MASTER_PORT)
    case("torch_rpc", ["--nnodes=2", "--nproc_per_node=1"] + C10D, ["rpc", "hello world"],
         agents=[["--role=master"], ["--role=worker"]], needs=tensorpipe_missing),
    case("rank_restart_after_failure", ["--nproc_per_node=2", "--master_port={port}", "--max_restarts=3"],
         ["kill_self"]),
    case("bipolar", ["--nproc_per_node=4", "--master_port={port}", "--max_restarts=2"], ["bipolar"],
         fails=True),
    case("nccl_async_error_handling_given", ["--nproc_per_node=2", "--master_port={port}"],
         ["env", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"],
         env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_ASYNC_ERROR_HANDLING": "0"}),
    case("watchdog_and_health_check_given", ["--nproc_per_node=2", "--master_port={port}"],
         ["env", "TORCHELASTIC_TIMER_FILE", "TORCHELASTIC_HEALTH_CHECK_PORT"],
         env={"TORCHELASTIC_TIMER_FILE": "/tmp/elastic-parity-timer", "TORCHELASTIC_HEALTH_CHECK_PORT": "12345"}),
    case("watchdog_not_given", ["--nproc_per_node=2", "--master_port={port}"],
         ["env", "TORCHELASTIC_TIMER_FILE", "TORCHELASTIC_HEALTH_CHECK_PORT"]),
    # errors/api_test.py: an error file the rank writes in the newer format
    case("error_file_message_and_timestamp", ["--nproc_per_node=2", "--master_port={port}"],
         ["error_file", json.dumps({"message": "boom", "timestamp": 10})], fails=True, error_file=True),
    # utils_test.py's rendezvous configs, through --rdzv_conf; api_test.py's Std.from_str
    case("rdzv_conf_spaces", ["--nnodes=1", "--nproc_per_node=1"] + C10D + ["--rdzv_conf= join_timeout = x "],
         ["env", "RANK"], refused=True),
    case("rdzv_conf_empty_value", ["--nnodes=1", "--nproc_per_node=1"] + C10D + ["--rdzv_conf=a="],
         ["env", "RANK"], refused=True),
    case("rdzv_conf_blank", ["--nnodes=1", "--nproc_per_node=1"] + C10D + ["--rdzv_conf=  "], ["env", "RANK"]),
    case("redirects_bad", ["--nproc_per_node=2", "--master_port={port}", "--redirects=0:1,"], refused=True),
]

# Differences launch keeps on purpose: (what, applies to this case, why).
KEPT = [
    ("exit status", lambda c, t, o: refused(c) and t == 1 and o == 2,
     "bad input is exit 2 under launch, before anything starts (docs/launching.md); torchrun "
     "raises from its argument checks and exits 1 with a traceback"),
]


def expand(items, port, out):
    return [x.replace("{port}", str(port)).replace("{out}", out) for x in items]


def one_side(c, who, launch, work):
    out = os.path.join(work, who)
    os.makedirs(out)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("OMP_NUM_THREADS", None)
    env["TEST_SENTINEL_PARENT"] = "FOOBAR"
    env.update({k: expand([v], port, out)[0] for k, v in c["env"].items()})
    error_file = os.path.join(work, who + "-error.json")
    if c["error_file"]:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    flags = expand(c["flags"], port, out)
    if c["program"] == ["{sh}"]:
        sh = os.path.join(work, "test_script.sh")
        with open(sh, "w") as f:
            f.write(SCRIPT)
        os.chmod(sh, 0o755)
        program = [sh, out]
    else:
        program = [WORKER, c["program"][0], out] + expand(c["program"][1:], port, out)
    if who == "torch":
        argv = TORCHRUN + flags + program
    else:
        env["PYTHON_EXEC"] = PY
        argv = launch_argv(launch, flags + program)
    started = time.monotonic()
    agents = c["agents"] if isinstance(c["agents"], list) else [[]] * c["agents"]
    at = len(argv) - len(program)  # each agent's own flags go before the program
    procs = [subprocess.Popen(argv[:at] + own + argv[at:], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for own in agents]
    texts, ended = [b""] * len(procs), [None] * len(procs)

    def collect(i):  # each agent on a thread of its own: its end is when it ends
        try:
            texts[i], _ = procs[i].communicate(timeout=240)
        except subprocess.TimeoutExpired:
            procs[i].kill()
            texts[i] = procs[i].communicate()[0] + b"\n[elastic_parity: killed after 240 s]\n"
        ended[i] = time.monotonic() - started
    threads = [threading.Thread(target=collect, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = [p.returncode for p in procs]
    console = "".join(t.decode(errors="replace") for t in texts)
    files = {}
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name), errors="replace") as f:
            files[name] = f.read()
    reported = None
    if c["error_file"] and os.path.exists(error_file):
        with open(error_file) as f:
            reported = json.load(f)
    return dict(codes=codes, files=files, console=console, argv=argv, reported=reported,
                seconds=time.monotonic() - started, ended=ended)


def message_of(reported):
    """The message and time a launcher's error file gives (its layout aside)."""
    if not isinstance(reported, dict):
        return reported
    m = reported.get("message", reported)
    if isinstance(m, dict):
        return {"message": m.get("message"), "timestamp": m.get("extraInfo", {}).get("timestamp")}
    return {"message": m}


def compare(c, theirs, ours):
    diffs, kept = [], set()
    for t, o in zip(theirs["codes"], ours["codes"]):
        if t == o:
            continue
        why = next((w for what, applies, w in KEPT if what == "exit status" and applies(c, t, o)), None)
        if why:
            kept.add(f"exit status {o}, torchrun {t} ({why})")
        else:
            diffs.append(f"exit status: launch {o}, torchrun {t}")
    # Both sides failing alike is no pass of a case that expects success, nor the reverse.
    for who, side in (("torchrun", theirs), ("launch", ours)):
        expected = all(code != 0 for code in side["codes"]) if refused(c) or c["fails"] \
            else all(code == 0 for code in side["codes"])
        if not expected:
            diffs.append(f"{who} exited {side['codes']}, which this case does not expect")
    if theirs["files"] != ours["files"]:
        diffs.append(f"the ranks' files: launch {ours['files']}, torchrun {theirs['files']}")
    if c["waits"]:
        for who, side in (("torchrun", theirs), ("launch", ours)):
            if min(side["ended"]) < c["waits"]:
                diffs.append(f"{who}'s first agent ended {min(side['ended']):.1f} s after the start, before "
                             f"the slowest node's ranks ({c['waits']} s later than the first's)")
    if c["console"]:
        seen = [sorted(set(re.findall(c["console"], side["console"]))) for side in (theirs, ours)]
        if seen[0] != seen[1]:
            diffs.append(f"console lines {c['console']!r}: launch {seen[1]}, torchrun {seen[0]}")
        if not seen[0]:
            diffs.append(f"torchrun printed no line {c['console']!r}: the case checks nothing")
    if c["launch_says"] and refused(c) and not re.search(c["launch_says"], ours["console"]):
        diffs.append(f"launch refused without saying {c['launch_says']!r}")
    if c["error_file"] and theirs["reported"] is None:
        diffs.append("torchrun wrote no launcher's error file: the case checks nothing")
    if c["error_file"] and message_of(theirs["reported"]) != message_of(ours["reported"]):
        diffs.append(f"the launcher's error file: launch {message_of(ours['reported'])}, "
                     f"torchrun {message_of(theirs['reported'])}")
    return diffs, kept


def show(side):
    return f"$ {shlex.join(side['argv'])}\nexit {side['codes']}\n{side['console'][-3000:]}"


def main():
    return run_cases(CASES, one_side, compare, "muster-elastic-", show)


if __name__ == "__main__":
    sys.exit(main())
