"""Every c10d store operation from PyTorch's own TCPStore client, as a worker under torchrun uses
it (TCPStore(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, False) wrapped in the agent-store prefix).

usage: tcpstore_ops.py ref            # against torch's own TCPStore server, started here
       tcpstore_ops.py HOST PORT      # against a server that is already there
       tcpstore_ops.py env            # at MASTER_ADDR:MASTER_PORT (a rank under a launcher)

Prints one JSON object (or writes it to $TCPSTORE_OPS_OUT): each operation's result, and for
a failing one the exception's class, so that a test can compare a run against muster's store
with a run against torch's. With torch 2.x's client, its methods too (append, multi_get/set,
check, list_keys, queues; wait and get timing out). Every keyed operation on a key of 8,192 bytes
on the wire, and ADD on stored values that are not plain decimal text.
"""
import datetime
import json
import os
import sys
import threading
import time

import torch.distributed as dist


def main():
    if sys.argv[1] == "ref":
        server = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30),
                               wait_for_workers=False)
        host, port = "127.0.0.1", server.port
    elif sys.argv[1] == "env":
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
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
    if hasattr(store, "multi_get"):
        extended(store, attempt1, out)
    # More clients, without a world size (which would count them in TCPStore's "init/" key).
    def connect():
        return dist.TCPStore(host, port, None, False, timeout)
    if hasattr(raw, "barrier"):
        barriers(connect, out)
    long_keys(connect, out)
    stored_values(connect, out)
    text = json.dumps(out, sort_keys=True)
    if os.environ.get("TCPSTORE_OPS_OUT"):
        with open(os.environ["TCPSTORE_OPS_OUT"], "w") as f:
            f.write(text)
    else:
        print(text, flush=True)


def outcome(call):
    """The value, or the exception's class (what a caller can tell apart)."""
    try:
        value = call()
    except Exception as e:  # the class is the answer being compared
        return "raised " + type(e).__name__
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in value]
    return value


def extended(store, other, out):
    """torch 2.x's client methods, on the same prefixed store."""
    store.set_timeout(datetime.timedelta(seconds=20))
    out["append_new"] = outcome(lambda: store.append("log", "a"))
    out["append_again"] = outcome(lambda: store.append("log", "bc"))
    out["get_appended"] = outcome(lambda: store.get("log"))
    out["multi_set"] = outcome(lambda: store.multi_set(["m1", "m2", "m3"], ["1", b"\x00\xff", ""]))
    out["multi_get"] = outcome(lambda: store.multi_get(["m1", "m2", "m3"]))
    out["check_present"] = outcome(lambda: store.check(["m1", "m2"]))
    out["check_one_absent"] = outcome(lambda: store.check(["m1", "nope"]))
    out["check_other_attempt"] = outcome(lambda: other.check(["m1"]))
    out["list_keys"] = outcome(lambda: sorted(store.list_keys()))
    out["num_keys_now"] = outcome(store.num_keys)
    out["has_extended_api"] = outcome(store.has_extended_api)
    out["queue_push"] = outcome(lambda: store.queue_push("q", "x"))
    out["queue_len"] = outcome(lambda: store.queue_len("q"))
    out["queue_pop"] = outcome(lambda: store.queue_pop("q"))
    store.set_timeout(datetime.timedelta(milliseconds=300))
    out["multi_get_missing"] = outcome(lambda: store.multi_get(["m1", "never"]))
    out["get_missing_class"] = outcome(lambda: store.get("never"))
    out["wait_missing_class"] = outcome(lambda: store.wait(["never"]))
    out["wait_given_timeout_class"] = outcome(
        lambda: store.wait(["never"], datetime.timedelta(milliseconds=200)))
    out["after_timeouts"] = outcome(lambda: store.add("n", 0))


def barriers(connect, out):
    """torch 2.14's TCPStore.barrier: three ranks, one late; the key used again; a rank alone
    that times out; a world size of 0."""
    ranks = [connect() for _ in range(3)]
    short = datetime.timedelta(milliseconds=500)
    done = {}

    def arrive(i, delay):
        time.sleep(delay)
        done[i] = outcome(lambda: ranks[i].barrier("b", 3, datetime.timedelta(seconds=20)))

    threads = [threading.Thread(target=arrive, args=(i, 0.3 * (i == 2))) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    out["barrier_three"] = [done.get(i) for i in range(3)]
    out["barrier_count"] = outcome(lambda: ranks[0].get("b"))
    out["barrier_again_alone"] = outcome(lambda: ranks[1].barrier("b", 3, short))
    out["barrier_timeout"] = outcome(lambda: ranks[0].barrier("alone", 2, short))
    out["barrier_timeout_count"] = outcome(lambda: ranks[1].get("alone"))
    out["barrier_world_0"] = outcome(lambda: ranks[2].barrier("zero", 0, short))
    # A parked rank let through by another's add, or by a count set outright.
    for name, poke in (("add", lambda: ranks[1].add("poked", 1)),
                       ("set", lambda: ranks[1].set("poked", "9"))):
        got = {}
        limit = {"add": 2, "set": 5}[name]  # the count is 1, then 3, when the rank arrives
        t = threading.Thread(target=lambda: got.setdefault("r", outcome(
            lambda: ranks[0].barrier("poked", limit, datetime.timedelta(seconds=5)))))
        t.start()
        time.sleep(0.3)
        poke()
        t.join(10)
        out[f"barrier_through_{name}"] = got.get("r", "still parked")


def long_keys(connect, out):
    """Every keyed operation on a key of 8,192 bytes on the wire (the client puts "/" before a
    key of 8,191), the most torch's libuv server takes; then one byte more, on its own client,
    since a server that refuses it closes the connection."""
    store = connect()
    key, other = "k" * 8191, "n" * 8191
    out["long_set"] = outcome(lambda: store.set(key, "v"))
    out["long_get"] = outcome(lambda: store.get(key))
    out["long_add"] = outcome(lambda: store.add(other, 3))
    out["long_compare_set"] = outcome(lambda: store.compare_set(key, "v", "w"))
    out["long_check"] = outcome(lambda: store.check([key, other]))
    out["long_wait"] = outcome(lambda: store.wait([key, other]))
    out["long_delete"] = outcome(lambda: store.delete_key(key))
    if hasattr(store, "multi_get"):
        out["long_append"] = outcome(lambda: store.append(key, "ab"))
        out["long_multi_set"] = outcome(lambda: store.multi_set([key, other], ["x", "7"]))
        out["long_multi_get"] = outcome(lambda: store.multi_get([key, other]))
        out["long_queue"] = outcome(lambda: (store.queue_push(key, "q"), store.queue_len(key),
                                             store.queue_pop(key)))
    out["longer_check"] = outcome(lambda: connect().check(["k" * 8192]))


def stored_values(connect, out):
    """ADD on a stored value that is not plain decimal text: c10d's servers read it as
    std::stoll does. Each on a client of its own: a refused one closes the connection."""
    for name, value in [("space", " 7"), ("plus", "+5"), ("trailing", "12abc"),
                        ("tab_newline", "\t\n8"), ("minus_trailing", "-3x"), ("hex", "0x10"),
                        ("word", "abc"), ("empty", ""), ("plus_minus", " +-1"),
                        ("past_64_bits", "99999999999999999999")]:
        store = connect()
        store.set("parse", value)
        out[f"add_on_{name}"] = outcome(lambda: store.add("parse", 1))


if __name__ == "__main__":
    main()
