"""How many workers `--nproc_per_node=gpu` and `auto` start under each CUDA_VISIBLE_DEVICES, by
this torch's torchrun and by launch, side by side, with what the CUDA runtime itself counts
(cudaGetDeviceCount through ctypes) and what torch parses (torch.cuda._parse_visible_devices):
the facts launcher/devices.cc follows. Values cover CUDA's rules: indices past the machine's
devices, repeats, signs, spaces, junk after digits, negatives, empty entries, UUIDs (this
machine's, a prefix of it, an unknown one) and MIG names.

usage: visible_devices.py LAUNCH [--out FILE.json]   (on a GPU machine; exit 1 when launch and
torchrun start a different number of workers for any value, or one refuses what the other runs)
"""
import argparse
import concurrent.futures
import ctypes.util
import json
import os
import re
import subprocess
import sys

PY = sys.executable

PROBE = r"""
import ctypes, json, os, sys
out = {}
try:
    rt = ctypes.CDLL(os.environ["PROBE_CUDART"])
    n = ctypes.c_int(-1)
    out["cudart_rc"] = rt.cudaGetDeviceCount(ctypes.byref(n))
    out["cudart"] = n.value
except Exception as e:
    out["cudart"] = f"error: {e}"
import torch
out["torch_count"] = torch.cuda.device_count()
out["torch_available"] = torch.cuda.is_available()
try:
    out["torch_parsed"] = [str(x) for x in torch.cuda._parse_visible_devices()]
except Exception as e:
    out["torch_parsed"] = f"error: {e}"
print(json.dumps(out))
"""

RANK = ["sh", "-c", 'echo "lws=$LOCAL_WORLD_SIZE"']


def workers(argv, env):
    """The LOCAL_WORLD_SIZE the launcher gave its ranks, or 'refused (exit N): last line'."""
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timed out"
    seen = re.findall(r"lws=(\d+)", done.stdout + done.stderr)
    if done.returncode == 0 and seen:
        return int(seen[0])
    last = (done.stderr.strip().splitlines() or ["-"])[-1][-160:]
    return f"refused (exit {done.returncode}): {last}"


def one(value, launch, cudart, port, extra=None):
    env = dict(os.environ, **(extra or {}))
    if value is None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = value
    row = {"value": value, **({"env": extra} if extra else {})}
    probe = subprocess.run([PY, "-c", PROBE], env=dict(env, PROBE_CUDART=cudart),
                           capture_output=True, text=True, timeout=120)
    row.update(json.loads(probe.stdout) if probe.returncode == 0 else {"probe": probe.stderr[-300:]})
    for nproc in ("gpu", "auto"):
        row[f"torchrun_{nproc}"] = workers(
            [PY, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--no_python",
             f"--master_port={port + (nproc == 'auto')}"] + RANK, env)
        row[f"launch_{nproc}"] = workers(
            [launch] + os.environ.get("MUSTER_TEST_LAUNCH_FLAGS", "").split()
            + [f"--nproc_per_node={nproc}", "--no_python", "--master_port=0"] + RANK, env)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("launch")
    parser.add_argument("--cudart", default=os.environ.get("CUDART") or ctypes.util.find_library("cudart"))
    parser.add_argument("--out")
    args = parser.parse_args()
    uuids = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.split()
    print("devices:", sorted(os.listdir("/dev")), "\nUUIDs:", uuids)
    for p in ("/proc/driver/nvidia/gpus",):
        if os.path.isdir(p):
            print(p, os.listdir(p))
    u = uuids[0] if uuids else "GPU-00000000-0000-0000-0000-000000000000"
    values = [None, "", "0", "1", "2", "0,1,2", "1,0", "0,0", "0,1,0", " 0", "0 ", " 0 ,1",
              "+0", "00", "0gpu", "0gpu,1", "gpu0", "-1", "0,-1,1", "-0", "0,,1", ",0", "0,abc",
              "abc", "4294967296", "99999999999999999999", u, u + ",0", "0," + u, u + "," + u,
              u[:12], u[4:], u.lower(), u + ",GPU-deadbeef", "GPU-deadbeef", "GPU-deadbeef," + u,
              "MIG-deadbeef", "0,MIG-deadbeef", u + ",1",
              # added after a review: bases, a sign alone, whole numbers, Python's blanks, Unicode
              "0x1", "0X1", "0,+", "+", "0,--1", "-4294967296", "0,99999999999999999999,99999999999999999998",
              "\x1c0", "0,\x1c1", "0,\u00a00", "\uff10", " " + u, u + ",MIG-deadbeef", "0,1\n"]
    nvml_check = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    runs = [(v, None) for v in values] + [(v, nvml_check) for v in ("0", "0,1,0", "\x1c0", "4294967296")]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(lambda iv: one(iv[1][0], args.launch, args.cudart, 29700 + 2 * iv[0], iv[1][1]),
                             enumerate(runs)))
    differ = 0
    for r in rows:
        # The same count, or both refused: torchrun with its exit 1, launch with one line and exit 2.
        same = all(r[f"torchrun_{n}"] == r[f"launch_{n}"] or
                   (str(r[f"torchrun_{n}"]).startswith("refused (exit 1)")
                    and str(r[f"launch_{n}"]).startswith("refused (exit 2)"))
                   for n in ("gpu", "auto"))
        differ += not same
        print(("ok  " if same else "DIFF"), json.dumps(r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"visible_devices: {differ} of {len(rows)} values differ")
    print("kept: not ASCII (launch refuses; torch strips and reads digits by Unicode's rules):",
          [r["value"] for r in rows if r["value"] and not r["value"].isascii()])
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
