"""Every c10d store operation from PyTorch's own TCPStore client, as a worker under torchrun uses
it (TCPStore(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, False) wrapped in the agent-store prefix).

usage: tcpstore_ops.py ref            # against torch's own TCPStore server, started here
       tcpstore_ops.py HOST PORT      # against a server that is already there

Prints one JSON object: each operation's result, so that a test can compare a run against
muster's store with a run against torch's.
"""
import datetime
import json
import sys
import threading
import time

import torch.distributed as dist


def main():
    if sys.argv[1] == "ref":
        server = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30),
                               wait_for_workers=False)
        host, port = "127.0.0.1", server.port
    else:
        host, port = sys.argv[1], int(sys.argv[2])
    timeout = datetime.timedelta(seconds=20)
    raw = dist.TCPStore(host, port, 2, False, timeout)
    store = dist.PrefixStore("/worker/attempt_0", raw)
    out = {}
    store.set("k", b"v")
    out["get"] = store.get("k").decode()
    store.set("k", "overwritten")
    out["get_overwritten"] = store.get("k").decode()
    out["add_new"] = store.add("n", 5)
    out["add_again"] = store.add("n", -2)
    out["get_counter"] = store.get("n").decode()
    out["cas_match"] = store.compare_set("k", "overwritten", "swapped").decode()
    out["cas_mismatch"] = store.compare_set("k", "nope", "x").decode()
    out["cas_missing_expected"] = store.compare_set("absent", "x", "y").decode()
    out["cas_missing_empty"] = store.compare_set("created", "", "fresh").decode()
    out["num_keys"] = store.num_keys()
    out["delete_present"] = store.delete_key("created")
    out["delete_absent"] = store.delete_key("created")
    out["num_keys_after_delete"] = store.num_keys()
    binary = bytes(range(256)) * 4096  # 1 MiB, every byte value
    store.set("bin", binary)
    out["binary_intact"] = store.get("bin") == binary
    store.wait(["k", "n"])
    out["wait_present"] = True
    started = time.monotonic()
    try:
        store.wait(["never"], datetime.timedelta(milliseconds=300))
        out["wait_timeout"] = "returned"
    except RuntimeError as e:
        out["wait_timeout"] = "raised"
        out["wait_timeout_fast"] = time.monotonic() - started < 5
    # The same connection still works after a timed-out wait.
    out["after_timeout"] = store.add("n", 0)
    # A get blocked in one client is released by another client's set.
    other = dist.PrefixStore("/worker/attempt_0", dist.TCPStore(host, port, 2, False, timeout))
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("v", other.get("late").decode()))
    t.start()
    time.sleep(0.3)
    store.set("late", "arrived")
    t.join(20)
    out["blocked_get"] = got.get("v")
    # Another attempt's prefix does not see this one's keys.
    attempt1 = dist.PrefixStore("/worker/attempt_1", raw)
    out["other_attempt_check"] = attempt1.num_keys() >= 0
    store.set_timeout(datetime.timedelta(milliseconds=300))
    try:
        attempt1.get("never-set-in-attempt-1")
        out["get_missing"] = "returned"
    except RuntimeError:
        out["get_missing"] = "raised"
    print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
