"""A Python rank for the channel's tests, run under launch. Modes (one or more, in order):

  all          the C++ channel_tool's "all" sequence, operation for operation (a ring of
               sends, broadcast, gather, all_gather for seven dtypes, then all_gather of
               bytes), so a job of C++ and Python ranks checks both directions
  shapes       every operation again with shapes from a scalar to 5-D, empty, non-contiguous
  bytes        send/recv, broadcast, gather, all_gather of bytes, empty and binary
  inplace      rank 1 changes a received tensor in place; rank 0's copy and a second
               receiver's are unchanged
  big MIB      rank 0 sends MIB mebibytes to rank 1, which checks every element
  send MIB     rank 1 sends MIB mebibytes of ones to rank 0 (MUSTER_TEST_TIMEOUT bounds it)
  recv         rank 0 receives from rank 1 (the fault tests)
  store        a key set by the previous rank is seen (the job's store is shared)
  progress S   muster.progress() every 0.2 s for S seconds, with no output, then hangs

Prints "channel_worker rank R: MODE ok" for each mode; exit 1 with the error otherwise.
"""

import os
import sys
import time

import muster  # cheap: torch loads with the channel (below), after "progress" has begun

torch = None


def value(r, dtype):
    return ((torch.arange(24).reshape(2, 3, 4) + r) % (2 + r)).to(dtype)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def mode_all(c):
    n, me = c.world_size, c.rank
    dtypes = [torch.float32, torch.float64, torch.int64, torch.int8, torch.bool, torch.float16,
              torch.bfloat16]
    for dtype in dtypes:
        c.send(value(me, dtype), (me + 1) % n)
        got = c.recv((me + n - 1) % n)
        check(torch.equal(got, value((me + n - 1) % n, dtype)) and got.dtype == dtype,
              f"ring recv mismatch ({dtype})")
        b = c.broadcast(value(n - 1, dtype) if me == n - 1 else None, n - 1)
        check(torch.equal(b, value(n - 1, dtype)), f"broadcast mismatch ({dtype})")
        g = c.gather(value(me, dtype), 0)
        if me == 0:
            check(len(g) == n and all(torch.equal(g[r], value(r, dtype)) for r in range(n)),
                  f"gather mismatch ({dtype})")
        else:
            check(g is None, "gather off the root returned something")
        every = c.all_gather(value(me, dtype))
        check(all(torch.equal(every[r], value(r, dtype)) for r in range(n)),
              f"all_gather mismatch ({dtype})")
    text = c.all_gather_bytes(f"sentence é from rank {me}".encode())
    check(text[n - 1] == f"sentence é from rank {n - 1}".encode(), "all_gather of bytes")


def shaped(r, shape, dtype):
    numel = 1
    for d in shape:
        numel *= d
    t = (torch.arange(numel, dtype=torch.float64) * (r + 1) - 7).reshape(shape)
    return t.to(dtype)


def mode_shapes(c):
    n, me = c.world_size, c.rank
    shapes = [(), (1,), (0,), (3, 0, 2), (5,), (17, 3), (2, 3, 4, 5), (1, 2, 1, 3, 2)]
    dtypes = [torch.float32, torch.int32, torch.uint8, torch.complex64, torch.int16,
              torch.float64]
    for shape in shapes:
        for dtype in dtypes:
            mine = shaped(me, shape, dtype)
            c.send(mine, (me + 1) % n, tag=3)
            got = c.recv((me + n - 1) % n, tag=3)
            check(got.shape == mine.shape and got.dtype == dtype and
                  torch.equal(got, shaped((me + n - 1) % n, shape, dtype)),
                  f"ring {shape} {dtype}")
            check(torch.equal(c.broadcast(shaped(0, shape, dtype), 0), shaped(0, shape, dtype)),
                  f"broadcast {shape} {dtype}")
            g = c.gather(mine, n - 1)
            if me == n - 1:
                check(all(torch.equal(g[r], shaped(r, shape, dtype)) for r in range(n)),
                      f"gather {shape} {dtype}")
            every = c.all_gather(mine)
            check(all(torch.equal(every[r], shaped(r, shape, dtype)) for r in range(n)),
                  f"all_gather {shape} {dtype}")
    # A non-contiguous view and a tensor that needs a gradient arrive as their values.
    view = torch.arange(60.0).reshape(6, 10)[::2, 1::3]
    got = c.all_gather(view + me)
    check(all(torch.equal(got[r], view + r) for r in range(n)), "non-contiguous")
    w = torch.ones(3, requires_grad=True)
    check(torch.equal(c.broadcast(w * 2, 0), torch.full((3,), 2.0)), "requires_grad")


def mode_bytes(c):
    n, me = c.world_size, c.rank
    blob = bytes(range(256)) * 3 + bytes([me])
    c.send_bytes(blob, (me + 1) % n)
    check(c.recv_bytes((me + n - 1) % n) == bytes(range(256)) * 3 + bytes([(me + n - 1) % n]),
          "bytes ring")
    c.send_bytes(b"", (me + 1) % n, tag=1)
    check(c.recv_bytes((me + n - 1) % n, tag=1) == b"", "empty bytes")
    check(c.broadcast_bytes(b"root says hi" if me == 1 else None, 1) == b"root says hi",
          "broadcast_bytes")
    g = c.gather_bytes(bytearray(f"r{me}".encode()), 0)
    check(me != 0 or g == [f"r{r}".encode() for r in range(n)], "gather_bytes")
    check(c.all_gather_bytes(memoryview(b"x" * me)) == [b"x" * r for r in range(n)],
          "all_gather_bytes")


def mode_inplace(c):
    me = c.rank
    original = torch.arange(1 << 20, dtype=torch.float32)
    got = c.broadcast(original if me == 0 else None, 0)
    if me == 1:
        got.mul_(-1).add_(5)  # in place, on the mapped pages
        check(got[10].item() == -5.0 and got.is_contiguous(), "the in-place change")
    c.all_gather_bytes(b"changed")  # rank 1 has changed its copy by now
    if me != 1:
        check(torch.equal(got, original), f"rank {me}'s copy changed with rank 1's")
    # The changed tensor is an ordinary one: it can be sent on.
    again = c.broadcast(got[:4].clone() if me == 1 else None, 1)
    check(torch.equal(again, torch.tensor([5.0, 4.0, 3.0, 2.0])), "sending the changed tensor")


def mode_big(c, mib):
    elements = mib * (1 << 20) // 4
    if c.rank == 0:
        t = torch.arange(elements, dtype=torch.int32)
        start = time.monotonic()
        c.send(t, 1)
        print(f"channel_worker rank 0: sent {mib} MiB in {time.monotonic() - start:.2f} s",
              flush=True)
    elif c.rank == 1:
        got = c.recv(0)
        check(got.numel() == elements and torch.equal(got, torch.arange(elements,
                                                                        dtype=torch.int32)),
              "the big tensor arrived wrong")
        print(f"channel_worker rank 1: received {mib} MiB intact", flush=True)


def mode_store(c):
    s = muster.store()
    me, n = c.rank, c.world_size
    s.set(f"py/{me}", f"from {me}".encode())
    s.wait([f"py/{(me + n - 1) % n}"])
    check(s.get(f"py/{(me + n - 1) % n}") == f"from {(me + n - 1) % n}".encode(), "store")


def main(argv):
    timeout = float(os.environ.get("MUSTER_TEST_TIMEOUT", "120"))
    modes = argv[1:] or ["all"]
    if modes[0] == "progress":
        end = time.monotonic() + float(modes[1])
        while time.monotonic() < end:
            muster.progress()
            time.sleep(0.2)
        time.sleep(3600)
        return 0
    global torch
    import torch
    c = muster.Channel(timeout=timeout, start_timeout=max(timeout, 120))
    i = 0
    while i < len(modes):
        mode = modes[i]
        if mode in ("big", "send"):
            mib = int(modes[i + 1])
            i += 1
            if mode == "big":
                mode_big(c, mib)
            else:
                c.send(torch.ones(mib * (1 << 20) // 4), 0)
        elif mode == "recv":
            c.recv(1)
        else:
            {"all": mode_all, "shapes": mode_shapes, "bytes": mode_bytes,
             "inplace": mode_inplace, "store": mode_store}[mode](c)
        print(f"channel_worker rank {c.rank}: {mode} ok", flush=True)
        i += 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (muster.ChannelError, AssertionError, ValueError) as e:
        print(f"channel_worker rank {os.environ.get('RANK', '?')}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        sys.exit(1)
