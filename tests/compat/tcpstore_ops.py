"""Every c10d store operation from PyTorch's own TCPStore client, as a worker under torchrun uses
it (TCPStore(MASTER_ADDR, MASTER_PORT, WORLD_SIZE, False) wrapped in the agent-store prefix).

usage: tcpstore_ops.py ref            # against torch's own TCPStore server, started here
       tcpstore_ops.py HOST PORT      # against a server that is already there
       tcpstore_ops.py env            # at MASTER_ADDR:MASTER_PORT (a rank under a launcher)

Prints one JSON object (or writes it to $TCPSTORE_OPS_OUT): each operation's result, and for
a failing one the exception's class, so that a test can compare a run against muster's store
with a run against torch's. With torch 2.x's client, its methods too (append, multi_get/set,
check, list_keys, queues; wait and get timing out). Every keyed operation on a key of 8,192 bytes
on the wire, and ADD on stored values that are not plain decimal text. Then the client calls of
PyTorch's own store tests (upstream_ports; docs/pytorch-tests.md maps them).
"""
import datetime
import inspect
import json
import os
import re
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
    upstream_ports(connect, out)
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
    # StoreTestBase.test_barrier, TCPStoreTest.test_barrier and test_barrier_with_timeout: a
    # world of one goes straight through, with the store's timeout and with one of its own.
    out["barrier_world_1"] = outcome(lambda: ranks[0].barrier("one", 1))
    out["barrier_world_1_timeout"] = outcome(
        lambda: ranks[0].barrier("one_timeout", 1, datetime.timedelta(seconds=10)))
    out["barrier_world_1_count"] = outcome(lambda: ranks[1].get("one"))
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


# Ports of PyTorch's own store tests (docs/pytorch-tests.md lists them all): each runs the client
# calls of the upstream tests it names against the server under test, on bare keys under a prefix
# of its own ("up<name>/"; launch's front puts bare keys and every /worker/attempt_N of a round in
# one key space, which the rest of this script uses too). A method that this torch's client lacks
# reads "raised AttributeError" from either server; a group that needs it records that once and
# stops.
def upstream_ports(connect, out):
    queues(connect, out)
    clone(connect, out)
    deleted_key(connect, out)
    timeout_same_key(connect, out)
    hammer(connect, out)
    hammer(connect, out, prefix="testPrefix")
    set_and_wait_many(connect, out)
    store_collectives(connect, out)
    elastic_store_util(connect, out)


def ranks_in_threads(connect, n, body, join_s=30):
    """body(store, rank) for ranks 0..n-1 in threads, each on a client of its own (closed when
    its thread ends); the ranks' outcomes in rank order ("still running" for one that hangs)."""
    done = {}

    def run(r):
        s = connect()
        done[r] = outcome(lambda: body(s, r))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return [done.get(r, "still running") for r in range(n)]


def queues(connect, out):
    """StoreTestBase.test_queues, test_queues_nonblocking, test_queues_bidirectional and
    test_queues_timeout: an absent queue's length; CHECK and WAIT on a queue's key; FIFO order,
    and empty again once drained; a pop without blocking on an empty queue and on one item; a
    blocking pop that outlives the store's timeout, and the same client afterwards; two clients
    (a clone where there is clone()) each blocked on what the other pushes. torch 2.14 built
    without libuv (Debian's) refuses queues in the client, so there every step reads
    NotImplementedError from either server."""
    s = connect()
    s.set_timeout(datetime.timedelta(seconds=5))
    fifo = "upq/fifo"
    out["q_len_absent"] = outcome(lambda: s.queue_len(fifo))
    if not hasattr(s, "queue_push"):
        return
    out["q_check_absent"] = outcome(lambda: s.check([fifo]))
    out["q_push_two"] = outcome(lambda: [s.queue_push(fifo, "1"), s.queue_push(fifo, "2")])
    out["q_check_pushed"] = outcome(lambda: s.check([fifo]))
    out["q_len_two"] = outcome(lambda: s.queue_len(fifo))
    if not str(out["q_push_two"]).startswith("raised"):
        out["q_wait"] = outcome(lambda: s.wait([fifo], datetime.timedelta(seconds=5)))
    out["q_pop_order"] = outcome(lambda: [s.queue_pop(fifo), s.queue_pop(fifo)])
    out["q_check_drained"] = outcome(lambda: s.check([fifo]))
    out["q_len_drained"] = outcome(lambda: s.queue_len(fifo))
    out["q_pop_nonblocking_empty"] = outcome(lambda: s.queue_pop("upq/empty", block=False))
    out["q_pop_nonblocking"] = outcome(
        lambda: [s.queue_push("upq/one", "a"), s.queue_pop("upq/one", block=False)][1])
    short = connect()
    short.set_timeout(datetime.timedelta(milliseconds=100))
    started = time.monotonic()
    out["q_pop_timeout"] = outcome(lambda: short.queue_pop("upq/never"))
    out["q_pop_timeout_fast"] = time.monotonic() - started < 5
    out["q_after_pop_timeout"] = outcome(lambda: short.add("upq/n", 1))
    a = connect()
    a.set_timeout(datetime.timedelta(seconds=5))
    b = a.clone() if hasattr(a, "clone") else connect()
    got = {}

    def first():  # pushes to "to_b", then waits for what b pushes back
        got["a"] = outcome(lambda: [a.queue_push("upq/to_b", "a1"), a.queue_pop("upq/to_a")][1])

    def second():  # waits for a's item, then answers
        got["b"] = outcome(lambda: [b.queue_pop("upq/to_b"), b.queue_push("upq/to_a", "b1")][0])

    threads = [threading.Thread(target=f, daemon=True) for f in (second, first)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    out["q_bidirectional"] = [got.get("a", "still parked"), got.get("b", "still parked")]


def clone(connect, out):
    """StoreTestBase.test_clone: clone() is a Store on a connection of its own that sees what
    the original set, and the other way round; a PrefixStore's clone keeps its prefix. torch
    2.14's client has it, older ones read AttributeError."""
    a = connect()
    a.set("upclone/foo", "bar")
    out["clone_get"] = outcome(lambda: a.clone().get("upclone/foo"))
    if not hasattr(a, "clone"):
        return
    c = a.clone()
    out["clone_is_store"] = isinstance(c, dist.Store)
    out["clone_set_seen"] = outcome(lambda: [c.set("upclone/back", "from clone"),
                                             a.get("upclone/back")][1])
    out["clone_prefixed_get"] = outcome(lambda: dist.PrefixStore("upclone", a).clone().get("foo"))


def deleted_key(connect, out):
    """TCPStoreTest.test_numkeys_delkeys (a deleted key is gone: GET times out) and
    StoreTestBase.test_set_get_check (set, get and delete of a key that starts with '-'): a
    deleted key reads as absent to CHECK, GET and WAIT, and ADD on it counts from 0 again. The
    timed-out calls are on a client of their own: torch 1.13's client leaves its waiter on the
    server, whose wake-up would reach the next answer on that connection (timeout_same_key)."""
    s, late = connect(), connect()
    late.set_timeout(datetime.timedelta(milliseconds=100))
    s.set("updel/k", "v")
    out["del_present"] = outcome(lambda: s.delete_key("updel/k"))
    out["del_check"] = outcome(lambda: s.check(["updel/k"]))
    out["del_get"] = outcome(lambda: late.get("updel/k"))
    out["del_wait"] = outcome(lambda: late.wait(["updel/k"], datetime.timedelta(milliseconds=100)))
    out["del_add_from_zero"] = outcome(lambda: s.add("updel/k", 4))
    out["del_set_again"] = outcome(lambda: [s.set("updel/k", "w"), s.get("updel/k")][1])
    out["dash_key"] = outcome(lambda: [s.set("-updel", "7"), s.get("-updel")][1])
    out["dash_key_add"] = outcome(lambda: s.add("-updel", 1))
    out["dash_key_check"] = outcome(lambda: s.check(["-updel"]))
    out["dash_key_delete"] = outcome(lambda: s.delete_key("-updel"))
    out["dash_key_gone"] = outcome(lambda: s.check(["-updel"]))


def timeout_same_key(connect, out):
    """RendezvousTCPTest.test_tcp_store_timeout_doest_break_client (and the message of
    test_tcp_store_timeout_set): a GET that timed out on a key, then SET and GET of that same key
    on the same client. torch 2.x's client cancels its wait (CANCEL_WAIT) at the timeout; 1.13's
    does not, so torch's server still holds the waiter and wakes it on the SET, and that byte
    comes before the next answer on the connection: 1.13's next get reads it as the start of its
    answer and fails. launch's front withdraws a parked wait when its client asks anything else
    (the client gave up on it), so that get returns the value: kept in tcpstore_parity.sh."""
    s = connect()
    s.set_timeout(datetime.timedelta(milliseconds=100))
    started = time.monotonic()
    try:
        s.get("upto/the_key")
        out["to_get"] = "returned"
    except Exception as e:  # the client's own words (wait timeout after 100ms, keys: ...)
        out["to_get"] = "raised " + type(e).__name__
        out["to_get_message"] = str(e).splitlines()[0] if str(e) else ""
    out["to_get_fast"] = time.monotonic() - started < 10
    # Upstream keeps 100 ms; more here, so that a slow answer reads as what it says, not as a
    # timeout (1.13's client then waits this long for the rest of a length that is garbled).
    s.set_timeout(datetime.timedelta(milliseconds=500))
    out["to_set_same_key"] = outcome(lambda: s.set("upto/the_key", "x"))
    out["to_get_same_key"] = outcome(lambda: s.get("upto/the_key"))
    out["to_then_add"] = outcome(lambda: s.add("upto/n", 1))
    out["to_then_check"] = outcome(lambda: s.check(["upto/the_key"]))


def hammer(connect, out, prefix=None, clients=16, rounds=100):
    """TCPStoreTest.cpp's testHelper (prefix None) and testHelperPrefix ("testPrefix"): 16
    clients at once each ADD 1 to one counter and SET then GET a key of their own, over and over;
    then, from another client, the counter and every key, the same once the 16 are gone,
    COMPARE_SET that misses and that hits, and DELETE of a key there and of one never set."""
    name = "uphammer_prefixed" if prefix else "uphammer"

    def wrap(s):
        return dist.PrefixStore(prefix, s) if prefix else s

    def body(s, i):
        s = wrap(s)
        for _ in range(rounds):
            s.add(f"{name}/counter", 1)
        wrong = 0
        for j in range(rounds):
            s.set(f"{name}/thread_{i}", f"val_{j}")
            wrong += s.get(f"{name}/thread_{i}") != f"val_{j}".encode()
        return wrong

    out[f"{name}_wrong_reads"] = ranks_in_threads(connect, clients, body, join_s=60)
    reader = wrap(connect())
    out[f"{name}_counter"] = outcome(lambda: reader.get(f"{name}/counter"))
    out[f"{name}_values"] = outcome(
        lambda: [reader.get(f"{name}/thread_{i}") for i in range(clients)])
    # The 16 clients closed with their threads; one more client still reads their data.
    out[f"{name}_after_disconnect"] = outcome(
        lambda: [wrap(connect()).get(f"{name}/counter"), wrap(connect()).get(f"{name}/thread_3")])
    out[f"{name}_compare_set"] = outcome(
        lambda: [reader.compare_set(f"{name}/thread_0", "wrong", "new"),
                 reader.compare_set(f"{name}/thread_0", f"val_{rounds - 1}", "new")])
    out[f"{name}_delete"] = outcome(lambda: [reader.delete_key(f"{name}/thread_0"),
                                             reader.delete_key(f"{name}/badKeyName")])


def set_and_wait_many(connect, out, n=64):
    """TCPStoreTest.cpp's testLibUVSetAndWait (128 clients there): n clients each SET a key of
    their own, then each WAITs for all n keys."""
    keys = [f"upmany/k_{j}" for j in range(n)]

    def body(s, i):
        s.set(keys[i], f"v_{i}")
        s.wait(keys, datetime.timedelta(seconds=30))
        return "through"

    got = ranks_in_threads(connect, n, body, join_s=60)
    out["many_through"] = sum(r == "through" for r in got)
    out["many_other"] = sorted({str(r) for r in got if r != "through"})


def store_collectives(connect, out):
    """test_control_collectives.py's TestCollectives (on a HashStore there), where the torch has
    dist._StoreCollectives (2.6 here): barrier, broadcast, gather, scatter, all_sum and a barrier
    then all_sum (test_simple_user_func), each rank on a client of its own; then each *_timeout
    with rank 1 of 4 alone: the exception's class, and the missing ranks that it found by CHECK."""
    out["cc_available"] = hasattr(dist, "_StoreCollectives")
    if not out["cc_available"]:
        return
    ample = datetime.timedelta(seconds=10)

    def ranks(n, f):
        return ranks_in_threads(connect, n, lambda s, r: f(dist._StoreCollectives(s, r, n), r))

    out["cc_barrier"] = ranks(2, lambda c, r: c.barrier("upcc/barrier", ample, True))
    out["cc_broadcast"] = ranks(4, lambda c, r: c.broadcast_send("upcc/bc", "data", ample)
                                if r == 2 else c.broadcast_recv("upcc/bc", ample))
    out["cc_gather"] = ranks(4, lambda c, r: c.gather_recv("upcc/gather", str(r), ample)
                             if r == 2 else c.gather_send("upcc/gather", str(r), ample))
    out["cc_scatter"] = ranks(4, lambda c, r: c.scatter_send(
        "upcc/scatter", [str(i) for i in range(4)], ample) if r == 2
        else c.scatter_recv("upcc/scatter", ample))
    out["cc_all_sum"] = ranks(4, lambda c, r: c.all_sum("upcc/sum", r, ample))
    out["cc_user_func"] = ranks(4, lambda c, r: [c.barrier("upcc/user_b", ample, True),
                                                 c.all_sum("upcc/user_sum", r, ample)][1])
    short = datetime.timedelta(milliseconds=100)

    def alone(call):
        try:
            call(dist._StoreCollectives(connect(), 1, 4))
            return "returned"
        except Exception as e:
            found = re.search(r"missing ranks: ((?:\d+, )*)", str(e))
            return ["raised " + type(e).__name__, found.group(1) if found else None]

    out["cc_broadcast_timeout"] = alone(lambda c: c.broadcast_recv("upcc/t_bc", short))
    out["cc_gather_timeout"] = alone(lambda c: c.gather_recv("upcc/t_gather", "x", short))
    out["cc_scatter_timeout"] = alone(lambda c: c.scatter_recv("upcc/t_scatter", short))
    out["cc_all_gather_timeout"] = alone(lambda c: c.all_gather("upcc/t_all_gather", "x", short))
    out["cc_barrier_timeout"] = alone(lambda c: c.barrier("upcc/t_barrier", short, True))
    out["cc_all_sum_timeout"] = alone(lambda c: c.all_sum("upcc/t_sum", 1, short))


def elastic_store_util(connect, out):
    """util_test.py's StoreUtilTest.test_synchronize_hash_store, test_barrier_hash_store and
    test_barrier_timeout_rank_tracing (on a HashStore there): torch.distributed.elastic.utils.store
    as this torch has it (1.13: GET and a ".FIN" key per rank; 2.x: MULTI_GET and an ADD-counted
    barrier), four ranks each on a client of its own; then 2 of 3 ranks in a barrier that times
    out, rank 0 naming the missing rank 2 and rank 1 pointing at rank 0 (2.x only)."""
    import torch.distributed.elastic.utils.store as store_util
    params = list(inspect.signature(store_util.barrier).parameters)
    # The timeouts by position: 1.13 names synchronize's barrier_timeout, 2.x timeout.
    out["su_synchronize"] = ranks_in_threads(connect, 4, lambda s, r: store_util.synchronize(
        s, f"data{r}".encode(), r, 4, "upsu/sync/", 20))
    if params[1] == "rank":  # 1.13: barrier(store, rank, world_size, key_prefix, barrier_timeout)
        out["su_barrier"] = ranks_in_threads(
            connect, 4, lambda s, r: store_util.barrier(s, r, 4, "upsu/barrier/", 20))
    else:
        out["su_barrier"] = ranks_in_threads(
            connect, 4, lambda s, r: store_util.barrier(s, 4, "upsu/barrier/", 20))
    if "rank_tracing_decoder" not in params:
        return
    # Rank 0 waits trace_timeout for each rank's trace key, then sets the gate, which rank 1
    # waits for within barrier_timeout: the two start together so that both hold.
    start = threading.Barrier(2)

    def traced(s, r):
        start.wait(10)
        try:
            store_util.barrier(s, 3, "upsu/traced/", barrier_timeout=0.5, rank=r,
                               rank_tracing_decoder=lambda x: f"Rank {x} host", trace_timeout=0.2)
            return "returned"
        except Exception as e:
            return ["raised " + type(e).__name__, "missing_ranks=[Rank 2 host]" in str(e),
                    "check rank 0 (Rank 0 host) for missing rank info" in str(e)]

    out["su_barrier_traced"] = ranks_in_threads(connect, 2, traced)


if __name__ == "__main__":
    main()
