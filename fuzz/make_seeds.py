#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora into fuzz/corpus/<target>/ (run from anywhere; it
replaces the seed-* files and leaves regression files, regress-*, alone). The inputs are what
each parser meets in use: both TCPStore generations' requests, direct-path frames, store
requests, command lines, stack dumps, configs. The targets that read their input through
libFuzzer's FuzzedDataProvider take integers from the input's end and strings from its front
(a backslash and another byte end a string; two backslashes are one): the seeds say so."""
import json
import os
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SOURCE = HERE.parent

# --- protobuf, enough for muster.v1.StoreRequest and DirectHello -------------------------------
def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

def field_bytes(number, data):
    return varint(number << 3 | 2) + varint(len(data)) + data

def field_int(number, value):
    return varint(number << 3) + varint(value)

def store_request(op_field, op_body=b"", ns=b"fz/0", rid=1, quiet=False, no_wait=False, batch=()):
    out = field_int(1, rid) + field_bytes(2, ns)
    if quiet:
        out += field_int(4, 1)
    if no_wait:
        out += field_int(5, 1)
    for b in batch:
        out += field_bytes(6, b)
    if op_field:
        out += field_bytes(op_field, op_body)
    return out

SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUMKEYS, MGET, MSET, APPEND, CLEAR, INFO, QPUSH, QPOP, QLEN, LIST = range(10, 27)

def kv(key, value=None):
    out = field_bytes(1, key)
    if value is not None:
        out += field_bytes(2, value)
    return out

STORE_REQUESTS = [
    store_request(SET, kv(b"k", b"v")),
    store_request(GET, kv(b"k"), rid=2),
    store_request(GET, kv(b"missing"), rid=3, no_wait=True),
    store_request(ADD, field_bytes(1, b"n") + field_int(2, 5), rid=4),
    store_request(ADD, field_bytes(1, b"n") + field_int(2, (1 << 64) - 1), rid=5),
    store_request(CAS, field_bytes(1, b"k") + field_bytes(2, b"v") + field_bytes(3, b"w"), rid=6),
    store_request(CHECK, field_bytes(1, b"k") + field_bytes(1, b"n"), rid=7),
    store_request(WAIT, field_bytes(1, b"later"), rid=8),
    store_request(SET, kv(b"later", b"now"), rid=9, quiet=True),
    store_request(DELETE, field_bytes(1, b"k"), rid=10),
    store_request(NUMKEYS, b"", rid=11),
    store_request(MGET, field_bytes(1, b"n") + field_bytes(1, b"later"), rid=12),
    store_request(MSET, field_bytes(1, b"a") + field_bytes(1, b"b") + field_bytes(2, b"1") + field_bytes(2, b"2"), rid=13),
    store_request(APPEND, kv(b"a", b"++"), rid=14),
    store_request(QPUSH, kv(b"q", b"item"), rid=15),
    store_request(QPOP, field_bytes(1, b"q"), rid=16),
    store_request(QLEN, field_bytes(1, b"q"), rid=17),
    store_request(LIST, b"", rid=18),
    store_request(INFO, b"", rid=19),
    store_request(CLEAR, b"", rid=20),
    store_request(0, b"", rid=21, batch=[store_request(SET, kv(b"x", b"1")), store_request(GET, kv(b"x"), rid=2)]),
    store_request(SET, kv(b"other", b"job"), ns=b"other/3", rid=22),
]

# --- FuzzedDataProvider ------------------------------------------------------------------------
def fdp_string(s):
    """A string ConsumeRandomLengthString reads back whole, ended."""
    return s.replace(b"\\", b"\\\\") + b"\\\n"

def fdp_tail(*values):
    """Bytes the provider's integer reads (from the end, the first read last) return as given:
    one byte each, for ranges of up to 256 values (ConsumeIntegralInRange: min + byte % range)."""
    return bytes(reversed(values))

# --- TCPStore wire -----------------------------------------------------------------------------
V1 = ["SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "WATCH_KEY", "DELETE_KEY"]
V2 = ["VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY", "APPEND",
      "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS", "BARRIER"]

def s(b):
    return struct.pack("<Q", len(b)) + b

def i64(n):
    return struct.pack("<q", n)

def wire(gen, op, *parts):
    table = V1 if gen == 1 else V2
    return bytes([table.index(op)]) + b"".join(parts)

VALIDATE = wire(2, "VALIDATE", struct.pack("<I", 0x3C85F7CE))

def v2(*requests):
    return VALIDATE + b"".join(requests)

WIRE_SEEDS = {
    "v1-set-get": wire(1, "SET", s(b"k"), s(b"v")) + wire(1, "GET", s(b"k")),
    "v1-add-check-wait": wire(1, "ADD", s(b"n"), i64(3)) + wire(1, "CHECK", i64(1), s(b"n")) + wire(1, "WAIT", i64(1), s(b"n")),
    "v1-compare-set": wire(1, "COMPARE_SET", s(b"k"), s(b""), s(b"first")),
    "v1-numkeys-delete": wire(1, "GETNUMKEYS") + wire(1, "DELETE_KEY", s(b"k")),
    "v1-watch-key": wire(1, "WATCH_KEY", s(b"k")),
    "v2-validate-ping": v2(wire(2, "PING", struct.pack("<I", 42))),
    "v2-set-get": v2(wire(2, "SET", s(b"k"), s(b"v")), wire(2, "GET", s(b"k"))),
    "v2-add-stoll": v2(wire(2, "SET", s(b"n"), s(b" 7")), wire(2, "ADD", s(b"n"), i64(-2))),
    "v2-append-multi": v2(wire(2, "APPEND", s(b"a"), s(b"x")),
                          wire(2, "MULTI_SET", i64(2), s(b"a"), s(b"1"), s(b"b"), s(b"2")),
                          wire(2, "MULTI_GET", i64(2), s(b"a"), s(b"b"))),
    "v2-wait-cancel": v2(wire(2, "WAIT", i64(1), s(b"never")), wire(2, "CANCEL_WAIT")),
    "v2-queue": v2(wire(2, "QUEUE_PUSH", s(b"q"), s(b"1")), wire(2, "QUEUE_LEN", s(b"q")), wire(2, "QUEUE_POP", s(b"q"))),
    "v2-list": v2(wire(2, "SET", s(b"a"), s(b"1")), wire(2, "LIST_KEYS")),
    "v2-barrier": v2(wire(2, "BARRIER", s(b"b"), i64(1)), wire(2, "BARRIER", s(b"b2"), i64(2))),
    "v2-compare-set-delete": v2(wire(2, "COMPARE_SET", s(b"k"), s(b""), s(b"v")), wire(2, "DELETE_KEY", s(b"k")),
                                wire(2, "GETNUMKEYS")),
    "v2-long-key": v2(wire(2, "SET", s(b"k" * 300), s(b"v"))),
    "truncated": v2(wire(2, "SET", s(b"k"), s(b"v")))[:-1],
    "garbage": b"\xff\x00\x01garbage",
}

# --- direct path frames ------------------------------------------------------------------------
def frame(kind, body):
    return struct.pack("<I", len(body) + 1) + bytes([kind]) + body

def direct_seed(opening, frames):
    return b"".join(frames) + fdp_tail(opening)

DIRECT_SEEDS = {
    "requests": direct_seed(2, [frame(2, r) for r in STORE_REQUESTS]),
    "wrong-token": direct_seed(1, [frame(2, STORE_REQUESTS[0])]),
    "no-hello": direct_seed(3, [frame(2, STORE_REQUESTS[0])]),
    "raw-magic-hello": direct_seed(0, [b"MUSTERD1", frame(1, field_bytes(1, b"tok")), frame(2, STORE_REQUESTS[1])]),
    "oversized-frame": direct_seed(2, [struct.pack("<I", 1 << 30) + b"\x02"]),
    "zero-frame": direct_seed(2, [struct.pack("<I", 0)]),
    "wrong-kind": direct_seed(2, [frame(3, b"")]),
    "bad-body": direct_seed(2, [frame(2, b"\xff\xff\xff")]),
    "park-then-set": direct_seed(2, [frame(2, STORE_REQUESTS[7]), frame(2, STORE_REQUESTS[8])]),
}

# --- launch's flags and environment ------------------------------------------------------------
VARIABLES = ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_CONF",
             "PET_RDZV_ID", "PET_REDIRECTS", "PET_TEE", "PET_LOCAL_RANKS_FILTER", "PET_NODE_RANK",
             "PET_SIGNALS_TO_HANDLE", "PET_MAX_RESTARTS", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_LOG_DIR",
             "PET_STANDALONE", "PET_HANG_TIMEOUT", "PET_DUPLICATE_STDOUT_FILTERS", "MUSTER_TORCHRUN_VERSION",
             "MUSTER_LEGACY_LAUNCH", "MUSTER_STACKS", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
             "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NNODES", "SLURM_NODEID",
             "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_SUBMIT_DIR",
             "CUDA_VISIBLE_DEVICES"]

def launch_seed(args, env=()):
    # Reads, in order: the case (0), the number of variables, then per variable its index (from
    # the end) and its value (from the front); then the arguments from the front.
    front = b""
    tail = [0, len(env)]
    for name, value in env:
        tail.append(VARIABLES.index(name))
        front += fdp_string(value.encode())
    front += b"".join(fdp_string(a.encode()) for a in args)
    return front + fdp_tail(*tail)

LAUNCH_SEEDS = {
    "standalone": launch_seed(["--standalone", "--nproc_per_node=2", "train.py", "--lr", "0.1"]),
    "elastic": launch_seed(["--nnodes=1:4", "--nproc_per_node=gpu", "--rdzv_backend=c10d",
                            "--rdzv_endpoint=[::1]:29400", "--rdzv_id=job", "--rdzv_conf=join_timeout=60,is_host=1",
                            "--max_restarts=3", "train.py"]),
    "etcd": launch_seed(["--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=https://a:2379,b:2379",
                         "--rdzv_conf=protocol=https,cacert=/ca,last_call_timeout=1", "-m", "pkg.main"]),
    "logs": launch_seed(["--log_dir=/tmp/l", "--redirects=0:3,1:2", "--tee=3", "--local_ranks_filter=0,1",
                         "--no_python", "/bin/true"]),
    "legacy": launch_seed(["--legacy_launch=1.13", "--use_env", "--hang_timeout=5", "--stacks=off", "a.py"]),
    "version": launch_seed(["--torchrun_version=2.6.0+cu124", "--signals_to_handle=SIGTERM,SIGUSR1", "x.py"]),
    "pet": launch_seed(["train.py"], [("PET_NNODES", "1:2"), ("PET_NPROC_PER_NODE", "auto"),
                                      ("PET_RDZV_CONF", "keep_alive_interval=1"), ("MUSTER_TORCHRUN_VERSION", "1.13")]),
    "slurm": launch_seed(["train.py"], [("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0"), ("SLURM_NNODES", "2"),
                                        ("SLURM_NODEID", "1"), ("SLURM_STEP_NODELIST", "node[01-02]")]),
    "help": launch_seed(["--help"]),
    "rdzv-conf": b"join_timeout=60,last_call_timeout=1,keep_alive_interval=5,keep_alive_max_attempt=3,is_host=false" + fdp_tail(1),
    "comma-list": b"a,,b ,c" + fdp_tail(2),
    "slurm-hosts": b"node[001-004,7],gpu-[1-2]" + fdp_tail(3),
    "host-port": b"[fe80::1%eth0]:29400" + fdp_tail(4),
    "torchrun-version": b"1.13.0a0+git" + fdp_tail(5),
    "visible-devices": b" 0 ,1gpu,2,0" + fdp_tail(6, 2, 0, 0),
    "visible-uuids": b"GPU-a1,GPU-a0,GPU-a,0" + fdp_tail(6, 3, 1, 1),
}

# --- stacks ------------------------------------------------------------------------------------
PYTHON_DUMP = b"""muster-stacks pid=4242 python
Thread 0x00007f9e27f4b6c0 (most recent call first):
  File "/tmp/fh.py", line 5 in loader
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f9e283a8040 (most recent call first):
  File "/tmp/fh.py", line 8 in train_step
  File "/tmp/fh.py", line 10 in <module>
"""
NATIVE_DUMP = b"""muster-stacks pid=77 native
Thread 77 (worker) current:
/lib/x86_64-linux-gnu/libc.so.6(clock_nanosleep+0xa3)[0x7f0000000001]
/opt/muster/worker(_ZN6muster5stuckEi+0x1e)[0x55d0c2f1a2b3]
/opt/muster/worker(+0x1234)[0x55d0c2f1a2b4]
[0x7f0000000009]

Thread 78 (gl\xc3\xb6\xc3):
/lib/x86_64-linux-gnu/libc.so.6(+0x8f2a1)[0x7f00000000a1]

Thread 79 did not answer

muster-stacks end
"""
STACKS_JSON = json.dumps([{"rank": 0, "local_rank": 0, "pid": 12, "host": "h", "answer": "answered", "kind": "python",
                           "state": "", "threads": [{"id": "0x1", "name": "", "current": True,
                                                     "frames": [{"function": "f", "file": "a.py", "line": 3}]}]}]).encode()
STACKS_SEEDS = {
    "python": PYTHON_DUMP + fdp_tail(1),
    "native": NATIVE_DUMP + fdp_tail(1),
    "json": STACKS_JSON + fdp_tail(0),
    "json-odd": b'[{"rank": 1e300, "threads": [{"frames": [{"line": -1}]}]}]' + fdp_tail(0),
}

# --- etcd --------------------------------------------------------------------------------------
ETCD_SEEDS = {
    "endpoints": b"https://10.0.0.1:2379,10.0.0.2,[::1]:2379" + fdp_tail(0),
    "conf": b"protocol=https,cacert=/etc/ca.pem,cert=/c,key=/k,etcd_prefix=/muster/x" + fdp_tail(1, 1),
    "conf-user": b"user=root,password_file=/p,ssl_cert=/c" + fdp_tail(1, 0),
    "run-ids": fdp_string(b"job/1") + b"job%2F1" + fdp_tail(2),
}

# The values launch writes at a run's keys (launcher/etcd_rendezvous.cc, etcd_rounds.cc), as
# etcdctl shows them; the last byte picks the key (0 state, 1 join, 2 report, 3 status).
NODE_A = b'{"id":"a1b2","host":"node-a","local_world_size":2,"master_port":29500,"role":"trainer","store_port":41000}'
NODE_B = b'{"id":"c3d4","host":"node-b","local_world_size":2,"master_port":29500,"store_port":0}'
ETCD_VALUE_SEEDS = {
    "state-running": b'{"max":2,"min":2,"nodes":[' + NODE_A + b"," + NODE_B
                     + b'],"phase":"running","round":0,"since":1795000000000}' + fdp_tail(0),
    "state-ended": b'{"event":{"exit_code":1,"group_rank":1,"host":"node-b","kind":2,"message":"rank 3 failed",'
                   b'"node":"c3d4"},"max":2,"min":2,"phase":"ended","round":0,"since":1795000000000}' + fdp_tail(0),
    "state-finished": b'{"max":2,"min":1,"nodes":[' + NODE_A + b'],"phase":"finished","round":3,"since":1}'
                      + fdp_tail(0),
    "join": b'{"host":"node-a","id":"a1b2","local_world_size":8,"master_port":29500,"max":4,"min":2,'
            b'"store_port":41000}' + fdp_tail(1),
    "report": b'{"exit_code":1,"message":"rank 3 (pid 4242) exited with 1","outcome":"failed"}' + fdp_tail(2),
    "status": b'{"round":1,"status":{"launch_pid":4242,"ranks":[{"rank":0,"pid":4243,"state":"RUNNING"}]},'
              b'"unix_ms":1795000000000}' + fdp_tail(3),
}

# --- the channel's files (worker/shared_dir_channel.cc): a 64-byte header, int64 shape[ndim],
# padded to 64 bytes, the payload; the last bytes say: make the checksums right (as the
# writer does), and read it as bytes (recvBytes) rather than a tensor.
def channel_file(kind, dtype, shape, payload, transfer=0x5eed):
    header_bytes = (64 + 8 * len(shape) + 63) // 64 * 64
    head = b"MUSTRCH1" + struct.pack("<IIQQQiIiIQ", 2, kind, transfer, len(payload), 0, dtype, len(shape), 0,
                                     header_bytes, 0)
    head += b"".join(struct.pack("<q", d) for d in shape)
    return head + b"\0" * (header_bytes - len(head)) + payload

FLOAT, LONG, BYTE = 6, 4, 0
CHANNEL_SEEDS = {
    "float-2x3": channel_file(1, FLOAT, [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)) + fdp_tail(1, 0),
    "long-scalar": channel_file(1, LONG, [], struct.pack("<q", -7)) + fdp_tail(1, 0),
    "empty": channel_file(1, FLOAT, [0, 4], b"") + fdp_tail(1, 0),
    "bytes": channel_file(2, BYTE, [5], b"hello") + fdp_tail(1, 1),
    "unsummed": channel_file(1, FLOAT, [2], struct.pack("<2f", 1, 2)) + fdp_tail(0, 0),
}

# --- worker's files ----------------------------------------------------------------------------
def read(rel):
    return (SOURCE / rel).read_bytes()

TSV = b"sentence\tlabel\na fine film .\t1\ndull and flat !\t0\n"
WORKER_SEEDS = {
    "train-config": read("configs/distributed_docnn.json") + fdp_tail(0),
    "decode-config": read("configs/decode_docnn.json") + fdp_tail(1),
    "tsv": TSV + fdp_tail(2),
    "tsv-unlabelled": b"sentence\na fine film .\n" + fdp_tail(2),
    "vocab": b"<pad>\n<unk>\nfilm\nfine\na\n" + fdp_tail(3),
}

# --- store requests, rendezvous ------------------------------------------------------------------
def store_seed(requests):
    # The limits first (two 2-byte reads: the largest of each range), then each "cancel a parked
    # request?" choice: no.
    front = b"".join(fdp_string(r) for r in requests)
    return front + b"\0" * len(requests) + fdp_tail(0x1F, 0xC0, 0x0F, 0xE0)

MEMORY_SEEDS = {
    "every-op": store_seed(STORE_REQUESTS),
    "wait-then-set": store_seed([STORE_REQUESTS[7], STORE_REQUESTS[8]]),
    "batch": store_seed([STORE_REQUESTS[20]]),
}

def join_request(run, node, lws, min_nodes, max_nodes, rank=-1):
    nodeinfo = field_bytes(1, node) + field_bytes(2, node) + field_int(3, lws) + field_int(4, rank & ((1 << 64) - 1))
    return field_bytes(1, run) + field_bytes(2, nodeinfo) + field_int(3, min_nodes) + field_int(4, max_nodes)

RENDEZVOUS_SEEDS = {
    # op 0 with a parsed request (bool true), twice: two nodes forming a round of two.
    "two-joins": fdp_string(join_request(b"a", b"n0", 2, 2, 2)) + fdp_string(join_request(b"a", b"n1", 2, 2, 2))
                 + fdp_tail(0, 1, 0, 1),
    "status": fdp_tail(8, 0, 8, 1),
}

TARGETS = {
    "tcpstore_wire": WIRE_SEEDS,
    "tcpstore_front": WIRE_SEEDS,
    "direct_frames": DIRECT_SEEDS,
    "memory_store": MEMORY_SEEDS,
    "rendezvous_state": RENDEZVOUS_SEEDS,
    "launch_options": LAUNCH_SEEDS,
    "stacks": STACKS_SEEDS,
    "etcd_conf": ETCD_SEEDS,
    "etcd_values": ETCD_VALUE_SEEDS,
    "channel_files": CHANNEL_SEEDS,
    "worker_config": WORKER_SEEDS,
}

def main():
    if sys.argv[1:] == ["--check"]:
        stale = []
        for target, seeds in TARGETS.items():
            d = CORPUS / target
            have = {f.name for f in d.glob("seed-*")}
            want = {f"seed-{n}" for n in seeds}
            stale += [f"{target}/{n} (not made)" for n in sorted(have - want)]
            stale += [f"{target}/{n} (missing)" for n in sorted(want - have)]
            stale += [f"{target}/seed-{n} (differs)" for n, data in seeds.items()
                      if (d / f"seed-{n}").exists() and (d / f"seed-{n}").read_bytes() != data]
        if stale:
            print("make_seeds: the corpus is not what make_seeds.py makes: " + ", ".join(stale)
                  + "; run fuzz/make_seeds.py", file=sys.stderr)
            return 1
        print("make_seeds: the seeds are current")
        return 0
    for target, seeds in TARGETS.items():
        d = CORPUS / target
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("seed-*"):
            old.unlink()
        for name, data in seeds.items():
            (d / f"seed-{name}").write_bytes(data)
    print(f"make_seeds: {sum(len(s) for s in TARGETS.values())} seeds for {len(TARGETS)} targets in {CORPUS}")

if __name__ == "__main__":
    sys.exit(main())
