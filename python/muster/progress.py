"""progress(): the heartbeat launch's hang detector (--hang_timeout) counts as progress.

It is a release request of the file timer's protocol (torchrun's TORCHELASTIC_TIMER_FILE) for a
scope no one holds, written to the FIFO launch names in MUSTER_PROGRESS_FIFO: torchrun's
FileTimerServer ignores it and launch counts it, exactly as the C++ library's heartbeat."""

import errno
import json
import os
import threading
import time

HEARTBEAT_SCOPE = "muster.heartbeat"  # common/contract.h kHeartbeatScope
_MIN_INTERVAL = 1.0

_lock = threading.Lock()
_last = [float("-inf")]


def progress():
    """Tells launch this rank is making progress. Cheap enough for every step: at most one
    write a second, non-blocking, and a no-op when launch set no progress FIFO (not started
    by launch, or no hang detector). Returns True when a heartbeat was written."""
    fifo = os.environ.get("MUSTER_PROGRESS_FIFO", "")
    if not fifo:
        return False
    now = time.monotonic()
    with _lock:
        if now - _last[0] < _MIN_INTERVAL:
            return False
        _last[0] = now
    line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": HEARTBEAT_SCOPE,
                       "expiration_time": -1, "signal": 0}) + "\n"
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # launch is not reading (gone): nothing to tell
    try:
        os.write(fd, line.encode())
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EPIPE):
            return False
        raise
    finally:
        os.close(fd)
