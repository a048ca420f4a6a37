"""Ports for tests that must name one before a program binds it (torchrun's --master_port,
etcd's, a manifest's --port): one no other test gets while this process lives.

A port from bind(0) is free only at the moment of asking: the kernel hands it to the next
bind(0) or connect() of any test running beside this one, and torchrun binds seconds later.
These come from a band below the kernel's ephemeral range (net.ipv4.ip_local_port_range), which
bind(0) and connect() never hand out, and each is held by an flock on a file in a folder all
tests share (tests/support/child.h's freePort() takes the same locks), released when this
process exits. Usage as a script: ports.py prints one port, from the band, held only while the
script runs (a shell test then relies on the band and the random pick).
"""
import fcntl
import os
import random
import socket

LOCKS = "/tmp/muster-test-ports"
_held = []  # lock files kept open: a port stays ours until the process ends


def band():
    """[first, end) outside the kernel's ephemeral range: below it from 20000 (Debian's range
    starts at 32768), else above it; child.h's freePort() reads the same."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    if min(low, 32000) - 20000 >= 1000:
        return 20000, min(low, 32000)
    if 65535 - high >= 1000:
        return high + 1, 65536
    return 20000, 32000


def _bindable(port):
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((address, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def reserve_port():
    """A port no other test holds and nothing listens on; held until this process exits."""
    try:
        os.mkdir(LOCKS)
        os.chmod(LOCKS, 0o1777)  # any user's tests share it
    except FileExistsError:
        pass
    rng = random.Random()
    first, end = band()
    for _ in range(1000):
        port = rng.randrange(first, end)
        fd = os.open(os.path.join(LOCKS, f"{port}.lock"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if _bindable(port):
            _held.append(fd)
            return port
        os.close(fd)
    raise RuntimeError(f"no free port in {first}-{end - 1} after 1000 tries")


if __name__ == "__main__":
    print(reserve_port())
