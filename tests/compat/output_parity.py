"""What a job leaves behind under launch and under the reference torchrun of one torch, side by
side: the workers' lines on the console (prefixes, --tee, --local-ranks-filter, the prefix
template), the files under --log_dir (layout and contents), the failure report (root cause:
rank, exit code, error file, traceback, host), the launcher's own error file
(TORCHELASTIC_ERROR_FILE given to the launcher), the launcher's exit code, torchelastic's event
lines (--event-log-handler=console) and a FileTimerClient timer that expires
(TORCHELASTIC_ENABLE_FILE_TIMER). Each case runs tests/compat/output_worker.py.

Run by with_torch.sh. usage: output_parity.py LAUNCH [CASE...]. One line per case, then every
difference; exit 1 when any case differs. Differences launch keeps on purpose are printed as
"kept:" with the reason.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity_support import PY, free_port, launch_argv, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "output_worker.py")
LOGS = ["--log_dir={log}", "--redirects=3", "--tee=3"]
FAILING = {"OUTPUT_SLEEP": "30"}


def case(name, flags, env=None, since=(1, 13), ranks=2, tmp_logs=False, needs=None):
    return dict(name=name, flags=flags, env=env or {}, since=since, ranks=ranks, tmp_logs=tmp_logs,
                needs=needs)


CASES = [
    case("plain", []),
    case("log_dir", ["--log_dir={log}"]),
    case("tee", LOGS),
    case("tee_only", ["--log_dir={log}", "--tee=3"]),
    case("redirect_out", ["--log_dir={log}", "--redirects=1"]),
    case("redirect_err", ["--log_dir={log}", "--redirects=2"]),
    # No --log_dir: each side's temporary base under its own TMPDIR.
    case("redirect_no_log_dir", ["--redirects=3"], tmp_logs=True),
    case("per_rank", ["--log_dir={log}", "--redirects=0:3,1:1", "--tee=0:1"]),
    case("local_ranks_filter", ["--local-ranks-filter=1"] + LOGS, since=(2, 4)),
    case("logs_specs", ["--logs-specs=default"] + LOGS, since=(2, 4)),
    case("prefix_template", ["--log-line-prefix-template=${role_name}-${rank}-${local_rank}:",
                             "--role=trainer"] + LOGS, since=(2, 14)),
    case("filters", ["--duplicate-stdout-filters=n=1", "--duplicate-stderr-filters=n=2"] + LOGS,
         since=(2, 14)),
    case("filters_untee", ["--log_dir={log}", "--duplicate-stdout-filters=n=1"], since=(2, 14)),
    case("raise", LOGS, env=dict(FAILING, OUTPUT_END="raise")),
    case("exit_code", LOGS, env=dict(FAILING, OUTPUT_END="exit")),
    case("segv", LOGS, env=dict(FAILING, OUTPUT_END="segv")),
    case("file_timer", LOGS, env=dict(FAILING, OUTPUT_END="timer",
                                      TORCHELASTIC_ENABLE_FILE_TIMER="1")),
    # Wherever torchrun takes the flag (2.14 here; 2.11 on the GPU machine; not 2.6 nor 1.13).
    case("events", ["--event-log-handler=console"], needs="--event-log-handler"),
    case("events_failed", ["--event-log-handler=console"], env=dict(FAILING, OUTPUT_END="raise"),
         needs="--event-log-handler"),
]

RUN_ID = "none"  # every case is static without --rdzv_id
EVENT = re.compile(r'^\{"name": "torchelastic\.')
PID = re.compile(r"\bpid:? \d+|\bPID \d+")
STAMP = re.compile(r'"timestamp": "\d+"')


def one_side(c, who, launch, work):
    log = os.path.join(work, who + "-logs")
    tag = os.path.join(work, who)  # in each worker's arguments, to find the ones left
    agent_error = os.path.join(work, who + "-error.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(c["env"])
    env["TORCHELASTIC_ERROR_FILE"] = agent_error
    tmp = os.path.join(work, who + "-tmp")
    if c["tmp_logs"]:
        os.makedirs(tmp)
        env["TMPDIR"] = tmp
    flags = ["--nproc_per_node=%d" % c["ranks"], "--master_port=%d" % free_port()]
    flags += [f.replace("{log}", log) for f in c["flags"]]
    if who == "torch":
        argv = os.environ["MUSTER_TEST_TORCHRUN"].split() + flags + [WORKER, tag]
    else:
        env["PYTHON_EXEC"] = PY
        argv = launch_argv(launch, flags + [WORKER, tag])
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=240, cwd=work)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if c["tmp_logs"]:
        # The temporary log base, the one folder left in TMPDIR (torchelastic_XXXX, muster_XXXX).
        left = sorted(os.listdir(tmp))
        log = os.path.join(tmp, left[0]) if len(left) == 1 else None
        files = log_files(log) if log else {"<left in TMPDIR>": left}
    else:
        files = log_files(log)
    return dict(rc=p.returncode, out=out, err=err, files=files,
                agent_error=read_json(agent_error), report=report(err), events=events(err),
                left=leftovers(tag))


def leftovers(tag):
    """Workers of this run still alive after the launcher is gone (killed here)."""
    time.sleep(0.2)
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tag.encode() in f.read().split(b"\0"):
                    pids.append(int(pid))
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return normalize_error(json.load(f))


def normalize_error(data):
    return json.loads(STAMP.sub('"timestamp": "T"', json.dumps(data)))


def log_files(log):
    """{path below the run's folder: contents, or DIR for a folder}; the run's folder is
    RUNID_RANDOM."""
    if not os.path.isdir(log):
        return None
    runs = os.listdir(log)
    if len(runs) != 1:
        return {"<run folders>": sorted(runs)}
    run = runs[0]
    files = {"<run folder>": run}
    for top, dirs, names in os.walk(os.path.join(log, run)):
        for name in dirs:
            files[os.path.relpath(os.path.join(top, name), os.path.join(log, run)) + "/"] = "DIR"
        for name in names:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, os.path.join(log, run))
            with open(path, "rb") as f:
                text = f.read().decode(errors="replace")
            if name == "error.json":
                text = normalize_error(json.loads(text))
            elif name.startswith("filtered_"):
                # The ranks' lines, as each wrote them: in no fixed order between ranks.
                text = sorted(scrub(text).splitlines())
            else:
                text = scrub(text)
            files[rel] = text
    return files


MARKED = re.compile(r"((?:\[[^\]\s]*\]|[\w-]+):)?(LINE (?:out|err) rank=\d+ (?:n=\d+|tail))")
PREFIXED = re.compile(r"^\[[a-z]+\d+\]:")
HEX = re.compile(r"0x[0-9a-f]+")
# UCX's fault handler (in Debian's torch 2.6): "[host:pid:0:tid] Caught signal 11", "(tid:  N)";
# it pads the numbers to a width ("[vm:4609 :0:4609]" once pids are under 5 digits).
UCX = re.compile(r"(\[[\w.-]+):\s*\d+\s*:\s*\d+\s*:\s*\d+\s*\]|tid: +\d+")


def scrub(text):
    """What differs between two runs of the same fault dump: addresses, pids."""
    return UCX.sub(lambda m: (m.group(1) + ":N]") if m.group(1) else "tid: N", HEX.sub("0xN", text))


def console(text):
    """The workers' lines on one stream: each marked line with its prefix (lines of several
    ranks can run together where one has no newline), and the other lines with a rank's prefix
    (tracebacks, fault dumps); sorted, as the ranks' order is not fixed. Lines launch or
    torchrun indent are their own reports quoting the workers."""
    found = []
    for line in text.splitlines():
        if line[:1].isspace():
            continue
        marked = MARKED.findall(line)
        if marked:
            found += [prefix + body for prefix, body in marked]
        elif PREFIXED.match(line):
            found.append(scrub(line))
    return sorted(found)


def report(err):
    """torchrun's summary: {"failures": [...], "root": {...}} of its "<program> FAILED" block."""
    at = err.find(" FAILED\n------")
    if at < 0:
        return None
    block = err[at:].split("\n" + "=" * 60)[0]
    parts = re.split(r"\n-{60}\n", block)
    found = {}
    for part in parts[1:]:
        title, _, body = part.partition("\n")
        entries = []
        for entry in re.split(r"\n(?=\[\d+\]:\n)", body):
            if not entry.strip() or "<NO_OTHER_FAILURES>" in entry:
                continue
            fields, key = {}, None
            for line in entry.splitlines()[1:]:
                m = re.match(r"^  (\w+)\s*: ?(.*)$", line)
                if m and m.group(1) in ("time", "host", "rank", "exitcode", "error_file",
                                        "traceback"):
                    key = m.group(1)
                    fields[key] = m.group(2).rstrip()
                elif key:
                    fields[key] += "\n" + line.rstrip()
            fields.pop("time", None)
            for k in fields:
                fields[k] = PID.sub("pid N", fields[k]).strip()
            if "error_file" in fields:
                fields["error_file"] = re.sub(r"^.*/attempt_", "attempt_", fields["error_file"])
            entries.append(fields)
        found["root" if title.startswith("Root Cause") else "failures"] = entries
    return found


def events(err):
    out = []
    for line in err.splitlines():
        if not EVENT.match(line):
            continue
        e = json.loads(line)
        md = e["metadata"]
        inner = json.loads(md["metadata"])
        if inner.get("entry_point") == os.path.basename(PY):
            inner["entry_point"] = "python3"
        if inner.get("worker_pid", [None])[0] is not None:
            inner["worker_pid"] = ["PID"]
        md["metadata"] = inner
        if md["worker_id"] is not None:
            md["worker_id"] = "PID"
        md["duration_ms"] = None if md["duration_ms"] is None else "MS"
        md["total_run_time"] = type(md["total_run_time"]).__name__
        if md["raw_error"] is not None:
            try:
                md["raw_error"] = normalize_error(json.loads(md["raw_error"]))
            except ValueError:
                md["raw_error"] = "TEXT"
        out.append(e)
    key = lambda e: (e["source"] == "AGENT" and e["metadata"]["state"] in ("SUCCEEDED", "FAILED"),
                     e["metadata"]["state"] != "RENDEZVOUS", e["metadata"]["global_rank"] or -1)
    return sorted(out, key=key)


# The stacks a roll-call took (launch takes the survivors' when a rank fails): the report,
# stacks-N.txt, beside the attempts, and each rank's answer in its folder. Only where launch said
# it took them ("every thread's stack: FILE"); launch's other files never are in a log folder.
STACKS = re.compile(r"^(stacks-\d+\.txt|attempt_\d+/\d+/stacks\.txt)$")
TOOK_STACKS = re.compile(r"every thread's stack: \S+/(stacks-\d+\.txt)")
KEPT_STACKS = ("launch took the ranks' stacks before it stopped them: the report and each "
               "rank's answer are in the log folder (docs/launching.md)")
KEPT_FAILURES = ("torchrun also lists, under Failures, the ranks it stopped itself with SIGTERM "
                 "after the root cause; launch lists only ranks that failed on their own and "
                 "says in its log which it stopped")


def compare(c, t, o):
    diffs, kept = [], set()

    def differ(what, theirs, ours):
        if theirs != ours:
            diffs.append(f"{what}: launch {ours!r}, torchrun {theirs!r}")

    if o["left"]:
        diffs.append(f"launch left {o['left']} worker(s) running after it exited")
    if t["left"]:
        kept.add(f"torchrun left {t['left']} worker(s) running after it ended (killed by the "
                 "test); launch left none")
    if t["rc"] < 0:
        # torchrun 2.14's FileTimerServer, once it has killed a rank, kills its own process with
        # the same signal ("Terminating the server process", file_based_local_timer.py).
        kept.add(f"torchrun died of signal {-t['rc']}, with no report and its other ranks left "
                 "running; launch stops the group, names the rank and the timer's scope and "
                 "exits 1")
        root = (o["report"] or {}).get("root") or [{}]
        if o["rc"] != 1 or not root[0].get("exitcode", "").startswith(f"{t['rc']} ") or \
                not root[0].get("rank", "").startswith("1 "):
            diffs.append(f"launch: exit {o['rc']}, root cause {root}; wanted exit 1 and rank 1 "
                         f"ended by signal {-t['rc']}")
        t["report"], o["report"], t["agent_error"], t["rc"] = None, None, o["agent_error"], o["rc"]
    differ("exit code", t["rc"], o["rc"])
    if t["files"] and o["files"]:  # RUNID_RANDOM: the same run id
        tf, of = t["files"]["<run folder>"], o["files"]["<run folder>"]
        if tf.startswith(RUN_ID + "_") and of.startswith(RUN_ID + "_"):
            t["files"]["<run folder>"] = o["files"]["<run folder>"] = "RUNID_RANDOM"
    differ("stdout lines", console(t["out"]), console(o["out"]))
    differ("stderr lines", console(t["err"]), console(o["err"]))
    tf, of = t["files"], o["files"]
    if tf is not None or of is not None:
        of = dict(of or {})
        taken = set(TOOK_STACKS.findall(o["err"]))
        stacks = {k for k in of if STACKS.match(k)}
        if taken and stacks:
            kept.add(KEPT_STACKS)
            for k in stacks:
                if k.startswith("stacks-") and k not in taken:
                    diffs.append(f"log file {k}: launch wrote it, but named only {sorted(taken)}")
                of.pop(k)
        for k in sorted(set(tf or {}) | set(of)):
            differ(f"log file {k}", (tf or {}).get(k), of.get(k))
    differ("launcher's error file", t["agent_error"], o["agent_error"])
    tr, orp = t["report"], o["report"]
    if (tr is None) != (orp is None):
        differ("failure report", tr, orp)
    elif tr:
        differ("root cause", tr.get("root"), orp.get("root"))
        stopped = [f for f in tr.get("failures", []) if f.get("exitcode", "").startswith("-15 ")]
        rest = [f for f in tr.get("failures", []) if f not in stopped]
        if stopped:
            kept.add(KEPT_FAILURES)
        differ("other failures", rest, orp.get("failures", []))
    if len(t["events"]) != len(o["events"]):
        differ("events", [(e["source"], e["metadata"]["state"]) for e in t["events"]],
               [(e["source"], e["metadata"]["state"]) for e in o["events"]])
    else:
        for te, oe in zip(t["events"], o["events"]):
            differ(f"event {te['source']} {te['metadata']['state']}", te, oe)
    return diffs, kept


def main():
    return run_cases(CASES, one_side, compare, "muster-output-", show=lambda side: side["err"][-4000:])


if __name__ == "__main__":
    sys.exit(main())
