#!/usr/bin/env python3
"""TCPStore servers side by side, in one run: what a job's start-up and its store traffic cost.

  front    muster's launch, which serves the workers' TCPStore on MASTER_PORT:
             launch --nproc_per_node=1 --master_addr=127.0.0.1 --master_port=PORT
                    --no_python sleep 100000          (the launch process is the one measured)
  libuv    torch's server: TCPStore(is_master=True, use_libuv=True), in a process of its own
  classic  the same with use_libuv=False

usage: store_startup.py [--launch PATH] [--servers front,libuv,classic] [--sizes 1024,4096,16000]
                        [--procs CPUS] [--threads 32] [--clients 64] [--seconds 5]
                        [--step-timeout 60] [--port-base PORT] [--out FILE]

Steps, each against a fresh server, each within --step-timeout (then killed, "timeout" in CSV):
  startup  for each size N: N ranks join as a job's ranks do, one TCPStore client (one
           connection) each: set addr/RANK, get addr/0 (rank 0 set it before the others
           started), add barrier; the rank whose add returns N sets barrier/done; every rank
           waits for it. The ranks run on --procs processes of --threads threads each; all
           connections stay open until every rank is through its wait, so the server holds N
           at once. Meanwhile a probe client (not a rank) times a set and a get every ms.
  ops      --clients clients (one TCPStore each, over processes and threads) set a 16-byte
           value on a key of their own and get it back, for --seconds, started together.

CSV on stdout, every line also appended to --out as it comes, after '# ' header lines:
  kind,server,size_or_clients   startup|ops, front|libuv|classic, ranks or clients
  seconds         startup: from the clients' start to the last rank through its wait;
                  ops: the measured window
  ops_per_s       ops: sets and gets per second (each counts one)
  p50_ms,p99_ms   startup: one rank's connect+set+get+add; ops: one set or get
  server_cpu_us_per_rank_or_op  the server process's utime+stime (all its threads, from
                  /proc/PID/stat, in clock ticks) over the seconds above, per rank or per op;
                  a start-up's includes the probe's ops
  server_bytes_per_conn  startup: (VmRSS with every rank connected - VmRSS before the clients
                  started) / (N x connections per client)
  probe_p99_ms    startup: the probe's p99 per op; its failed ops are in note
  errors          ranks or clients that failed
  status          ok | skip (why in note) | timeout | error
  note            backend=... (the server's own libuvBackend), descriptors the server held,
                  probe samples, or what went wrong

Every process raises its RLIMIT_NOFILE soft limit to the hard one; a size that would need more
descriptors than that minus 64 (server or a client process) is skipped with the reason.
Exit status: 0 when every step gave a row that is ok or a skip with its reason, 1 when one timed
out or failed, 2 for bad arguments. Nothing is left running: each step's server (and launch's
worker), probe and clients are stopped, and killed if need be, before the next.

The clients are this Python's torch. torch 2.x's TCPStore opens one connection per client;
1.13's opens two (the second for callbacks) and has neither use_libuv nor libuvBackend: the
script measures connections per client at start and reports what it found.
"""
import argparse
import csv
import ctypes
import io
import math
import multiprocessing as mp
import multiprocessing.forkserver
import os
import platform
import queue
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import timedelta

HOST = "127.0.0.1"
SERVERS = ("front", "libuv", "classic")
COLUMNS = ["kind", "server", "size_or_clients", "seconds", "ops_per_s", "p50_ms", "p99_ms",
           "server_cpu_us_per_rank_or_op", "server_bytes_per_conn", "probe_p99_ms", "errors",
           "status", "note"]
FD_SLACK = 64                    # descriptors kept free in every process beside the connections
ADDR_VALUE = "10.0.0.1:29500"    # what a rank publishes as its address
OPS_VALUE = "0123456789abcdef"   # the 16-byte value of the ops step
PROBE_INTERVAL_S = 0.001
PROBE_TIMEOUT_S = 10
HIST_STEPS = 32                  # histogram buckets per doubling of a latency (about 2% wide)
HIST_SIZE = 48 * HIST_STEPS      # up to 2**48 ns
CLK_TCK = os.sysconf("SC_CLK_TCK")
LIBC = ctypes.CDLL(None, use_errno=True)  # for prctl, resolved before any fork
# How torch says it has no libuv server (2.x's TCPStore, create_libuv_tcpstore_backend).
NO_LIBUV = re.compile(r"without libuv|libuv not available|libuv implementation missing", re.I)
SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))


class StepTimeout(Exception):
    """A step ran past --step-timeout; the message says what it was waiting for."""


class StepFailed(Exception):
    """A step's server, probe or clients failed; errors counts the ranks or clients."""

    def __init__(self, note, errors=0):
        super().__init__(note)
        self.errors = errors


# ---------------------------------------------------------------- every process's set-up

def raise_nofile():
    """Raises this process's RLIMIT_NOFILE soft limit to the hard one; returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def die_with_parent(sig):
    """Has the kernel send SIG to this process when its parent dies (PR_SET_PDEATHSIG), so
    that a benchmark killed outright takes its servers and clients along."""
    try:
        LIBC.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except AttributeError:
        pass


def child_setup():
    """The start of every client and server process: its own descriptor limit, and no life
    beyond the fork server's (which ends with this script)."""
    raise_nofile()
    die_with_parent(signal.SIGKILL)


def launch_preexec():
    """Runs in launch's process before exec: the raised descriptor limit, SIGTERM (launch
    stops its worker on it) should this script die."""
    raise_nofile()
    die_with_parent(signal.SIGTERM)


def describe(error):
    """An exception as one short line for the CSV."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


# ---------------------------------------------------------------- /proc readings

def proc_stat(pid):
    """/proc/PID/stat's fields from the state on (the field numbered 3 in proc(5) is [0])."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_us(pid):
    """PID's user+system CPU time so far, all threads, in microseconds (clock-tick grain)."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) * 1e6 / CLK_TCK  # utime, stime: fields 14, 15


def rss_bytes(pid):
    """PID's resident memory (VmRSS) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def open_fds(pid):
    """How many descriptors PID has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def server_reading(pid):
    """(CPU µs, RSS bytes, open descriptors) of a server; StepFailed when it is gone."""
    try:
        return cpu_us(pid), rss_bytes(pid), open_fds(pid)
    except (FileNotFoundError, ProcessLookupError) as e:
        raise StepFailed(f"server process {pid} is gone") from e


def descendants(pid):
    """(pid, start time) of every process below PID, so that they can be killed even when
    PID is gone and the pids may have been reused."""
    children = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = proc_stat(entry)
            except OSError:
                continue
            children[int(fields[1])].append((int(entry), fields[19]))  # ppid, starttime
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def kill_if_same(pid, started, sig):
    """Sends SIG to PID when it is still the process that started at STARTED."""
    try:
        if proc_stat(pid)[19] == started:
            os.kill(pid, sig)
    except (OSError, IndexError):
        pass


def port_room():
    """How many local ports connect() can use (net.ipv4.ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return high - low + 1
    except (OSError, ValueError):
        return 28232


def free_port():
    """A port nothing listens on now: the kernel's pick for a socket bound to HOST:0."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- latency histograms

def new_hist():
    """An empty latency histogram: counts per bucket, HIST_STEPS buckets per doubling."""
    return [0] * HIST_SIZE


def hist_add(hist, ns):
    """Counts one latency of NS nanoseconds."""
    hist[min(HIST_SIZE - 1, int(math.log2(ns) * HIST_STEPS)) if ns > 1 else 0] += 1


def hist_merge(into, hist):
    """Adds HIST's counts to INTO."""
    for i, n in enumerate(hist):
        if n:
            into[i] += n


def hist_quantile_ms(hist, q):
    """The Q quantile of HIST in milliseconds (a bucket's middle), None when it is empty."""
    total = sum(hist)
    if not total:
        return None
    want, seen = max(1, math.ceil(q * total)), 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= want:
            return 2 ** ((i + 0.5) / HIST_STEPS) / 1e6
    return None


# ---------------------------------------------------------------- torch, in child processes

def connect(port, facts, timeout_s):
    """A TCPStore client to HOST:PORT as torch 2.x's ranks make one (no world size, no wait
    for workers). use_libuv picks the server's backend only, the client is the same either way;
    False is passed where it is accepted because a torch built without libuv refuses True."""
    import torch.distributed as dist
    kwargs = dict(is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    if facts["accepts_use_libuv"]:
        kwargs["use_libuv"] = False
    return dist.TCPStore(HOST, port, **kwargs)


def socket_and_other_fds():
    """(sockets, other descriptors) this process has open."""
    sockets = others = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            sockets += 1
        else:
            others += 1
    return sockets, others


def torch_facts(reports):
    """Child: this torch's version, whether TCPStore takes use_libuv and has libuvBackend, and
    what one client costs: the connections the server holds for it, the client's descriptors.
    Measured against a classic server in this process, which holds the other end of each."""
    child_setup()
    try:
        import torch
        import torch.distributed as dist
        facts = {"torch": torch.__version__, "python": platform.python_version(),
                 "executable": sys.executable}
        kwargs = dict(is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
        try:
            server = dist.TCPStore(HOST, 0, use_libuv=False, **kwargs)
            facts["accepts_use_libuv"] = True
        except TypeError:  # torch 1.13: no such argument
            server = dist.TCPStore(HOST, 0, **kwargs)
            facts["accepts_use_libuv"] = False
        facts["has_libuv_backend"] = hasattr(server, "libuvBackend")

        def settled():  # after a round trip and a pause: every connection accepted
            server.set("facts", "1")
            time.sleep(0.2)
            return socket_and_other_fds()
        sockets, others = settled()  # the server's own connections (1.13's master has two)
        client = connect(server.port, facts, 10)
        client.set("facts", "1")
        sockets2, others2 = settled()
        conns = max(1, (sockets2 - sockets) // 2)  # both ends are in this process
        facts["conns_per_store"] = conns
        facts["client_fds_per_store"] = conns + max(0, others2 - others)
        reports.put(("facts", facts))
        del client, server
    except Exception as e:  # noqa: BLE001 - reported, the parent says what is missing
        reports.put(("failed", describe(e)))


def serve_torch_store(kind, port, facts, reports):
    """Child: torch's own TCPStore server of KIND (libuv or classic) on PORT, reporting the
    backend it really got (libuvBackend), until the parent ends it."""
    child_setup()
    import torch.distributed as dist
    kwargs = dict(is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    if facts["accepts_use_libuv"]:
        kwargs["use_libuv"] = kind == "libuv"
    try:
        store = dist.TCPStore(HOST, port, **kwargs)
    except Exception as e:  # noqa: BLE001 - e.g. "built without libuv support"
        reports.put(("failed", describe(e)))
        return
    backend = getattr(store, "libuvBackend", None)
    print(f"store_startup: {kind} server, pid {os.getpid()}, port {port}: libuvBackend={backend}",
          file=sys.stderr, flush=True)
    reports.put(("ready", backend))
    while True:  # the store serves from its own thread(s)
        time.sleep(3600)


def run_threads(items, threads, work, errors):
    """Runs WORK(item) for every item on up to THREADS threads, each taking every THREADS-th
    item in turn; an exception is appended to ERRORS and its thread goes on."""
    def each(chunk):
        for item in chunk:
            try:
                work(item)
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(describe(e))
    count = max(1, min(threads, len(items)))
    pool = [threading.Thread(target=each, args=(items[j::count],)) for j in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def startup_ranks(index, procs, size, threads, port, facts, timeout_s, start, rank0_set, close,
                  reports):
    """Child: one client process of a start-up step, the ranks INDEX, INDEX+PROCS, ... of SIZE.
    Rank 0 (process 0) sets addr/0 before the others start. Reports ready, then joined (with
    the ranks that failed), then done (when its last rank is through its wait), and keeps its
    connections open until CLOSE."""
    child_setup()
    ranks = list(range(index, size, procs))
    stores = [None] * len(ranks)
    took_ns, errors = [], []

    def join(i):
        begin = time.perf_counter_ns()
        stores[i] = store = connect(port, facts, timeout_s)
        store.set(f"addr/{ranks[i]}", ADDR_VALUE)
        store.get("addr/0")
        if store.add("barrier", 1) == size:
            store.set("barrier/done", "1")
        took_ns.append(time.perf_counter_ns() - begin)

    reports.put(("ready", index))
    try:
        start.wait(timeout_s)
    except threading.BrokenBarrierError:
        return  # the parent gave up on the step
    todo = list(range(len(ranks)))
    if index == 0:
        run_threads(todo[:1], 1, join, errors)
        rank0_set.set()
        todo = todo[1:]
    elif not rank0_set.wait(timeout_s):
        errors.append("rank 0 did not set addr/0")
    if not errors:
        run_threads(todo, threads, join, errors)
    reports.put(("joined", index, len(errors), errors[:1]))
    if not errors:
        run_threads(list(range(len(ranks))), threads,
                    lambda i: stores[i].wait(["barrier/done"]), errors)
        hist = new_hist()
        for ns in took_ns:
            hist_add(hist, ns)
        reports.put(("done", index, time.monotonic(), len(errors), errors[:1], hist))
    close.wait(timeout_s)
    stores.clear()  # closes the connections


def probe_store(port, facts, timeout_s, start, stop, reports):
    """Child: the probe, a client that is no rank, timing a set and a get on its own key every
    PROBE_INTERVAL_S from START until STOP (each op may take up to PROBE_TIMEOUT_S)."""
    child_setup()
    try:
        store = connect(port, facts, PROBE_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001
        reports.put(("failed", f"probe: {describe(e)}"))
        return
    reports.put(("ready", "probe"))
    try:
        start.wait(timeout_s)
    except threading.BrokenBarrierError:
        return
    hist, failed, first = new_hist(), 0, None
    ops = (lambda: store.set("probe/key", "x"), lambda: store.get("probe/key"))
    while not stop.is_set():
        for op in ops:
            begin = time.perf_counter_ns()
            try:
                op()
                hist_add(hist, time.perf_counter_ns() - begin)
            except Exception as e:  # noqa: BLE001
                failed, first = failed + 1, first or describe(e)
        time.sleep(PROBE_INTERVAL_S)
    reports.put(("probe", hist, failed, first))


def ops_clients(index, first_client, count, seconds, port, facts, timeout_s, start, reports):
    """Child: COUNT clients of the ops step on a thread each, clients FIRST_CLIENT on: from
    START, each sets its key to a 16-byte value and gets it back for SECONDS."""
    child_setup()
    try:
        stores = [connect(port, facts, timeout_s) for _ in range(count)]
    except Exception as e:  # noqa: BLE001
        reports.put(("failed", describe(e)))
        return
    results = []

    def client(c):
        store, key = stores[c], f"ops/{first_client + c}"
        hist, ops, errors, first = new_hist(), 0, 0, None
        while time.monotonic() < end:
            begin = time.perf_counter_ns()
            try:
                store.set(key, OPS_VALUE)
                middle = time.perf_counter_ns()
                value = store.get(key)
            except Exception as e:  # noqa: BLE001 - a broken client stops
                errors, first = errors + 1, describe(e)
                break
            hist_add(hist, middle - begin)
            hist_add(hist, time.perf_counter_ns() - middle)
            ops += 2
            if len(value) != len(OPS_VALUE):
                errors, first = errors + 1, first or f"get returned {len(value)} bytes"
        results.append((ops, errors, first, hist))

    reports.put(("ready", index))
    try:
        start.wait(timeout_s)
    except threading.BrokenBarrierError:
        return
    end = time.monotonic() + seconds
    pool = [threading.Thread(target=client, args=(c,)) for c in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    hist = new_hist()
    for r in results:
        hist_merge(hist, r[3])
    firsts = [r[2] for r in results if r[2]]
    reports.put(("ops", index, sum(r[0] for r in results), sum(r[1] for r in results),
                 firsts[:1], hist, time.monotonic()))
    stores.clear()


# ---------------------------------------------------------------- servers, from the parent

LIVE = []  # what main's clean-up stops, whatever happens: servers and steps


class FrontServer:
    """muster's launch serving the TCPStore protocol on MASTER_PORT; its own pid is measured
    (not its worker's). A fresh one per step."""
    name = "front"

    def __init__(self, launch, workdir):
        self.launch, self.workdir = launch, workdir
        self.unusable = None if launch and os.access(launch, os.X_OK) else \
            f"no launch binary at {launch} (--launch)"
        self.proc, self.kids, self.backend = None, [], "front"

    def start(self, port, deadline):
        """Starts launch on PORT and waits until it accepts a connection there."""
        log = os.path.join(self.workdir, f"front-{port}.log")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [self.launch, "--nproc_per_node=1", f"--master_addr={HOST}",
                 f"--master_port={port}", f"--log_dir={self.workdir}/front-{port}",
                 "--no_python", "sleep", "100000"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=launch_preexec)
        LIVE.append(self)
        self.pid = self.proc.pid
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(log, errors="replace") as f:
                    tail = " | ".join(f.read().strip().splitlines()[-2:])
                raise StepFailed(f"launch exited with {self.proc.returncode}: {tail}")
            try:
                socket.create_connection((HOST, port), timeout=0.5).close()
                self.kids = descendants(self.pid)
                return
            except OSError:
                time.sleep(0.05)
        raise StepTimeout(f"launch did not serve on port {port}")

    def alive(self):
        """Whether launch is still running."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        """SIGTERM to launch (it stops its worker); SIGKILL to its process group when it is not
        gone in 10 s; SIGKILL to any process it started that is still there (its worker and
        helper have process groups of their own)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.kids += descendants(self.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()
        for pid, started in self.kids:
            kill_if_same(pid, started, signal.SIGKILL)
        self.proc, self.kids = None, []
        if self in LIVE:
            LIVE.remove(self)


class TorchServer:
    """torch's TCPStore server (libuv or classic) in a child process of its own, which is the
    process measured. A fresh one per step; a backend found missing is skipped from then on."""

    def __init__(self, kind, ctx, facts):
        self.name, self.ctx, self.facts = kind, ctx, facts
        self.proc, self.backend, self.unusable = None, None, None
        if kind == "libuv" and not facts["accepts_use_libuv"]:
            self.unusable = f"torch {facts['torch']}'s TCPStore has no use_libuv"

    def start(self, port, deadline):
        """Starts the server on PORT; checks it got the backend asked for (libuvBackend)."""
        reports = self.ctx.Queue()
        self.proc = self.ctx.Process(target=serve_torch_store, daemon=True,
                                     args=(self.name, port, self.facts, reports))
        self.proc.start()
        LIVE.append(self)
        self.pid = self.proc.pid
        try:
            msg = reports.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise StepTimeout(f"the {self.name} server did not start") from None
        if msg[0] == "failed":
            if NO_LIBUV.search(msg[1]):
                self.unusable = msg[1]
                raise StepFailed(msg[1])  # main turns it into a skip
            raise StepFailed(f"server: {msg[1]}")
        self.backend = {True: "libuv", False: "classic", None: "classic (no libuvBackend)"}[msg[1]]
        if (self.name == "libuv") != (msg[1] is True):
            self.unusable = f"asked use_libuv={self.name == 'libuv'}, libuvBackend is {msg[1]}"
            raise StepFailed(self.unusable)

    def alive(self):
        """Whether the server process is still running."""
        return self.proc is not None and self.proc.is_alive()

    def stop(self):
        """Ends the server process (SIGTERM, SIGKILL after 5 s)."""
        if self.proc is None:
            return
        self.proc.terminate()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.proc = None
        if self in LIVE:
            LIVE.remove(self)


class Step:
    """One step's client processes (probe included) and their reports, against a deadline."""

    def __init__(self, ctx, server, deadline):
        self.ctx, self.server, self.deadline = ctx, server, deadline
        self.reports = ctx.Queue()
        self.procs, self.got = [], defaultdict(list)
        LIVE.append(self)

    def spawn(self, target, *args):
        """Starts TARGET(*args, reports) in a client process."""
        p = self.ctx.Process(target=target, args=args + (self.reports,), daemon=True)
        p.start()
        self.procs.append(p)

    def left(self):
        """Seconds to the deadline."""
        return self.deadline - time.monotonic()

    def release(self, barrier, what):
        """Lets the clients waiting at `barrier` go together (StepTimeout naming `what` when they
        do not all come in time); returns the moment they went."""
        try:
            barrier.wait(max(0.1, self.left()))
        except threading.BrokenBarrierError:
            raise StepTimeout(what) from None
        return time.monotonic()

    def expect(self, kind, count, what):
        """Waits for COUNT reports of KIND; StepTimeout at the deadline, StepFailed as soon as
        a client reports failed ranks or dies, or the server dies."""
        while len(self.got[kind]) < count:
            if self.left() <= 0:
                raise StepTimeout(f"waiting for {what} ({len(self.got[kind])} of {count})")
            try:
                msg = self.reports.get(timeout=min(self.left(), 0.25))
            except queue.Empty:
                dead = [p.exitcode for p in self.procs if p.exitcode not in (None, 0)]
                if dead:
                    raise StepFailed(f"a client process exited with {dead[0]}") from None
                if not self.server.alive():
                    raise StepFailed("the server exited") from None
                continue
            self.got[msg[0]].append(msg)
            if msg[0] == "failed":
                raise StepFailed(msg[1], 1)
            if msg[0] == "joined" and msg[2]:
                raise StepFailed(f"rank failed: {msg[3][0]}", msg[2])
        return self.got[kind][:count]

    def stop(self, gently=False):
        """Ends the client processes: GENTLY gives them 10 s to close their stores and exit."""
        if gently:
            until = time.monotonic() + 10
            for p in self.procs:
                p.join(max(0, until - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        if self in LIVE:
            LIVE.remove(self)


# ---------------------------------------------------------------- the steps

def fmt(value, digits):
    """A number for the CSV, empty for None."""
    return "" if value is None else f"{value:.{digits}f}"


def run_step(kind, server, count, args, ctx, ports, body):
    """The frame of every step: a skip for a server found unusable, a fresh server on a new
    port, BODY(step, port, row), and whatever happens, the server and clients stopped."""
    row = {"kind": kind, "server": server.name, "size_or_clients": count, "errors": 0,
           "status": "ok", "note": ""}
    if server.unusable:
        row.update(status="skip", note=server.unusable)
        return row
    deadline = time.monotonic() + args.step_timeout
    step, port, ok = Step(ctx, server, deadline), next(ports), False
    try:
        server.start(port, deadline)
        body(step, port, row)
        ok = True
    except StepTimeout as e:
        row.update(status="timeout", note=f"timeout after {args.step_timeout} s, {e}")
    except StepFailed as e:
        skipped = server.unusable is not None
        row.update(status="skip" if skipped else "error", errors=e.errors, note=str(e))
    finally:
        step.stop(gently=ok)
        server.stop()
    if ok and server.backend:
        row["note"] = f"backend={server.backend}; {row['note']}".rstrip("; ")
    return row


def too_many_descriptors(size, procs, facts, soft):
    """Why SIZE ranks on PROCS client processes do not fit in the descriptors (RLIMIT_NOFILE
    SOFT less FD_SLACK, for the server and for each client process) or the local ports; None
    when they do."""
    conns = size * facts["conns_per_store"]
    client_fds = math.ceil(size / procs) * facts["client_fds_per_store"]
    room = soft - FD_SLACK
    if conns > room:
        return f"the server would hold {conns} connections; RLIMIT_NOFILE {soft} - {FD_SLACK}"
    if client_fds > room:
        return (f"a client process would hold {client_fds} descriptors; RLIMIT_NOFILE {soft} - "
                f"{FD_SLACK} (more --procs)")
    if conns + FD_SLACK > port_room():
        return f"{conns} connections need more local ports than the {port_room()} there are"
    return None


def startup_step(server, size, args, ctx, facts, ports, soft):
    """Step 1 for one server and SIZE ranks (see the usage text)."""
    conns = size * facts["conns_per_store"]
    procs = min(args.procs, size)
    too_many = too_many_descriptors(size, procs, facts, soft)
    if too_many:
        return {"kind": "startup", "server": server.name, "size_or_clients": size, "errors": 0,
                "status": "skip", "note": too_many}

    start = ctx.Barrier(procs + 2)  # the client processes, the probe and this one
    rank0_set, close, stop = ctx.Event(), ctx.Event(), ctx.Event()

    def body(step, port, row):
        try:
            step.spawn(probe_store, port, facts, args.step_timeout, start, stop)
            for i in range(procs):
                step.spawn(startup_ranks, i, procs, size, args.threads, port, facts,
                           args.step_timeout, start, rank0_set, close)
            step.expect("ready", procs + 1, "the clients to start")
            cpu0, rss0, fds0 = server_reading(server.pid)
            t0 = step.release(start, "the clients to start")
            done = step.expect("done", procs, "the ranks")
            cpu1, rss1, fds1 = server_reading(server.pid)  # every rank connected, none closed
            stop.set()
            _, probe_hist, probe_failed, probe_first = step.expect("probe", 1, "the probe")[0]
        finally:
            stop.set()
            close.set()
            start.abort()
        hist = new_hist()
        for msg in done:
            hist_merge(hist, msg[5])
        errors = sum(msg[3] for msg in done)
        row.update(seconds=fmt(max(msg[2] for msg in done) - t0, 3),
                   p50_ms=fmt(hist_quantile_ms(hist, 0.5), 3),
                   p99_ms=fmt(hist_quantile_ms(hist, 0.99), 3),
                   server_cpu_us_per_rank_or_op=fmt((cpu1 - cpu0) / size, 1),
                   server_bytes_per_conn=fmt((rss1 - rss0) / conns, 0),
                   probe_p99_ms=fmt(hist_quantile_ms(probe_hist, 0.99), 3),
                   errors=errors, status="ok" if not errors else "error")
        notes = [f"server_fds=+{fds1 - fds0}", f"rss=+{(rss1 - rss0) // 1024} KiB",
                 f"probe_ops={sum(probe_hist)}", f"probe_failed={probe_failed}",
                 f"procs={procs}x{args.threads} threads"]
        if probe_first:
            notes.append(f"probe error: {probe_first}")
        if errors:
            notes.append(f"rank error: {[m[4][0] for m in done if m[4]][0]}")
        row["note"] = "; ".join(notes)

    return run_step("startup", server, size, args, ctx, ports, body)


def ops_step(server, args, ctx, facts, ports):
    """Step 2 for one server: --clients clients setting and getting for --seconds."""
    procs = min(args.procs, args.clients)
    share = [args.clients // procs + (i < args.clients % procs) for i in range(procs)]
    start = ctx.Barrier(procs + 1)

    def body(step, port, row):
        try:
            for i in range(procs):
                step.spawn(ops_clients, i, sum(share[:i]), share[i], args.seconds, port, facts,
                           args.step_timeout, start)
            step.expect("ready", procs, "the clients to connect")
            cpu0 = server_reading(server.pid)[0]
            t0 = step.release(start, "the clients to connect")
            results = step.expect("ops", procs, "the clients to finish")
            cpu1 = server_reading(server.pid)[0]
        finally:
            start.abort()
        hist, ops = new_hist(), sum(msg[2] for msg in results)
        for msg in results:
            hist_merge(hist, msg[5])
        seconds = max(msg[6] for msg in results) - t0
        errors = sum(msg[3] for msg in results)
        firsts = [msg[4][0] for msg in results if msg[4]]
        row.update(seconds=fmt(seconds, 3), ops_per_s=fmt(ops / seconds, 0),
                   p50_ms=fmt(hist_quantile_ms(hist, 0.5), 3),
                   p99_ms=fmt(hist_quantile_ms(hist, 0.99), 3),
                   server_cpu_us_per_rank_or_op=fmt((cpu1 - cpu0) / ops if ops else None, 2),
                   errors=errors, status="ok" if not errors else "error",
                   note=f"ops={ops}; procs={procs}" + (f"; error: {firsts[0]}" if firsts else ""))

    return run_step("ops", server, args.clients, args, ctx, ports, body)


# ---------------------------------------------------------------- output and main

class Output:
    """CSV on stdout and appended to --out, every line flushed as it is written."""

    def __init__(self, path):
        self.file = open(path, "a") if path else None

    def close(self):
        """Closes --out."""
        if self.file:
            self.file.close()

    def line(self, text):
        """Writes TEXT as one line to both."""
        for f in (sys.stdout, self.file):
            if f:
                f.write(text + "\n")
                f.flush()

    def comment(self, text):
        """A '# ' header line."""
        self.line(f"# {text}")

    def row(self, values):
        """One CSV row from a dict keyed by COLUMNS (missing ones empty)."""
        buf = io.StringIO()
        csv.writer(buf, lineterminator="").writerow([values.get(c, "") for c in COLUMNS])
        self.line(buf.getvalue())


def launch_version(launch):
    """launch --version's lines, or why there are none."""
    try:
        out = subprocess.run([launch, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines() or [f"(no output, exit {out.returncode})"]
    except (OSError, subprocess.SubprocessError) as e:
        return [f"(not run: {describe(e)})"]


def get_facts(ctx, timeout):
    """torch_facts' findings, from a child process; exits with a message when torch is not
    usable."""
    reports = ctx.Queue()
    p = ctx.Process(target=torch_facts, args=(reports,), daemon=True)
    p.start()
    try:
        msg = reports.get(timeout=timeout)
    except queue.Empty:
        msg = ("failed", f"no answer in {timeout} s")
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    if msg[0] != "facts":
        sys.exit(f"store_startup: this Python's torch.distributed cannot be used: {msg[1]}")
    return msg[1]


def ports_from(base):
    """The servers' ports: BASE, BASE+1, ... or, without one, a free port each time."""
    n = 0
    while True:
        yield base + n if base else free_port()
        n += 1


def parse_args():
    """The command line (the usage text above)."""
    default_launch = os.environ.get("MUSTER_BUILD_DIR", os.path.join(SCRIPT_DIR, "..", "..",
                                                                     "build"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch", default=os.path.join(default_launch, "launcher", "launch"),
                        help="muster's launch binary (default: the build tree's)")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--sizes", default="1024,4096,16000", help="ranks per start-up step")
    parser.add_argument("--procs", type=int, default=os.cpu_count(), help="client processes")
    parser.add_argument("--threads", type=int, default=32, help="threads per client process")
    parser.add_argument("--clients", type=int, default=64, help="clients of the ops step")
    parser.add_argument("--seconds", type=float, default=5, help="length of the ops step")
    parser.add_argument("--step-timeout", type=float, default=60)
    parser.add_argument("--port-base", type=int, default=0,
                        help="servers' ports from here on, one per step (default: a free port "
                        "each time); keep them out of net.ipv4.ip_local_port_range, where the "
                        "clients' own ends of earlier connections may linger in TIME_WAIT")
    parser.add_argument("--out", help="file the CSV is appended to as well")
    args = parser.parse_args()
    args.servers = [s for s in args.servers.split(",") if s]
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error("--sizes takes numbers, comma-separated")
    if any(s not in SERVERS for s in args.servers):
        parser.error(f"--servers takes {', '.join(SERVERS)}")
    if min(args.sizes + [args.procs, args.threads, args.clients]) < 1 or args.seconds <= 0:
        parser.error("sizes, --procs, --threads, --clients and --seconds must be positive")
    if args.seconds >= args.step_timeout:
        parser.error("--seconds must be shorter than --step-timeout, which bounds the ops step")
    args.launch = os.path.abspath(args.launch)
    return args


def main():
    """Header, the start-up steps (by size, then server), the ops steps; exit status."""
    args = parse_args()
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = raise_nofile()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    # Clients and servers fork from one server process that imported torch (and this file)
    # once: a step's processes start in milliseconds, and none forks a threaded parent.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "torch.distributed"])
    out = Output(args.out)
    workdir = tempfile.mkdtemp(prefix="store_startup.")
    rows = []
    try:
        facts = get_facts(ctx, 120)
        out.comment(f"store_startup.py: TCPStore servers side by side, {time.strftime('%F %T %z')}"
                    f", {platform.node()}, Linux {platform.release()}")
        out.comment(f"python {facts['python']} ({facts['executable']}), torch {facts['torch']}, "
                    f"os.cpu_count() {os.cpu_count()}")
        out.comment(f"RLIMIT_NOFILE soft/hard {before[0]}/{before[1]}, raised to {soft}/{hard} in "
                    f"every process (resource.getrlimit hard: {hard}); local ports {port_room()}; "
                    f"CPU times in clock ticks of {1e6 / CLK_TCK:.0f} us")
        out.comment(f"client TCPStore: {facts['conns_per_store']} connection(s), "
                    f"{facts['client_fds_per_store']} descriptor(s) each; use_libuv "
                    f"{'accepted' if facts['accepts_use_libuv'] else 'not accepted'}; libuvBackend "
                    f"{'present' if facts['has_libuv_backend'] else 'absent'}")
        for line in launch_version(args.launch):
            out.comment(f"{args.launch} --version: {line}")
        out.comment(f"sizes {args.sizes}, servers {args.servers}, procs {args.procs} x threads "
                    f"{args.threads}, ops: {args.clients} clients for {args.seconds} s, step "
                    f"timeout {args.step_timeout} s")
        out.line(",".join(COLUMNS))
        servers = [FrontServer(args.launch, workdir) if name == "front"
                   else TorchServer(name, ctx, facts) for name in args.servers]
        ports = ports_from(args.port_base)
        for size in args.sizes:
            for server in servers:
                rows.append(startup_step(server, size, args, ctx, facts, ports, soft))
                out.row(rows[-1])
        for server in servers:
            rows.append(ops_step(server, args, ctx, facts, ports))
            out.row(rows[-1])
    finally:
        for thing in list(LIVE):  # left running only when this script is being interrupted
            thing.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        out.close()
        # The fork server ends by itself once this process is gone; stopping it here (a
        # private call, where there is one) leaves nothing behind when this script returns.
        getattr(mp.forkserver._forkserver, "_stop", lambda: None)()
    failed = [r for r in rows if r["status"] not in ("ok", "skip")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
