"""stop_requested(step): a rank's side of launch's coordinated stop.

    for step in range(start, steps):
        if muster.stop_requested(step):
            save_checkpoint(step)
            break
        train_one_step()

When the job is told to stop (a scheduler's notice to any node's launch: SIGUSR1 by default),
every rank of every node is told True at the same step, and False at every step before it. The
rank saves what it needs and exits 0; launch reports "stopped at step S" and exits with its stop
code (docs/launching.md, "Stopping a job cleanly").

The node's stop board is a small file launch names in MUSTER_STOP_FILE, read and written under
flock(2) in the layout common/stop_board.h gives (the C++ worker library's stopRequested() reads
the same file, so C++ and Python ranks of one job agree).
"""

import fcntl
import operator
import os
import struct
import threading
import time

STOP_FILE = "MUSTER_STOP_FILE"  # common/contract.h kStopFile
STOP_SLOT = "MUSTER_STOP_SLOT"  # common/contract.h kStopSlot: the rank's local rank
RESUMED_FROM_STEP = "MUSTER_RESUMED_FROM_STEP"  # common/contract.h kResumedFromStep
_MAGIC = b"MSTOPBD1"
_HEADER_WORDS = 8
_MAX_SLOTS = 4096
_NONE = -1
_FROZEN, _HORIZON, _STOP = 2, 3, 4
_INT64_MAX = 2**63 - 1


class _Asker:
    def __init__(self):
        self.lock = threading.Lock()
        self.opened = False
        self.fd = -1
        self.slot = 0
        self.horizon = 0
        self.stop_step = _NONE
        self.calls_since = 0  # calls since window_start
        self.window_start = 0.0
        self.ahead = 1


_asker = _Asker()


def _open(a):
    """Opens the board launch named, once it can: an error is raised again at the next call."""
    path = os.environ.get(STOP_FILE, "")
    if not path:
        a.opened = True
        return
    slot = os.environ.get(STOP_SLOT, "")
    if not (slot.isascii() and slot.isdigit() and int(slot) < _MAX_SLOTS):
        raise RuntimeError(f"stop_requested: {STOP_FILE} is set but {STOP_SLOT} is not a slot ({slot or 'unset'})")
    try:
        a.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise RuntimeError(f"stop_requested: cannot open the stop board {STOP_FILE}='{path}': "
                           f"{e.strerror}") from None
    a.slot = int(slot)
    a.opened = True


_MAX_AHEAD = 256  # steps a rank may be promised past its own at one ask (worker/stop_request.cc)


def _ahead(a, now):
    """Calls this rank makes in about a millisecond (stop_board.h's "ahead"), measured over a
    window of at least a millisecond of calls: counted by calls, so that a loop that skips steps
    is not taken for a fast one (worker/stop_request.cc's aheadOf)."""
    ms = (now - a.window_start) * 1000.0
    if a.window_start == 0.0 or ms >= 1.0:
        if a.window_start != 0.0:
            a.ahead = min(max(int(a.calls_since / ms), 1), _MAX_AHEAD)
        a.window_start, a.calls_since = now, 0
    return a.ahead


def _ask(a, step, ahead):
    """One locked look at the board: (answer, horizon, stop step), answer "go", "stop" or
    "wait" (common/stop_board.cc's ask())."""
    what = f"the stop board ({STOP_FILE})"
    fcntl.flock(a.fd, fcntl.LOCK_EX)
    try:
        head = os.pread(a.fd, _HEADER_WORDS * 8, 0)
        if len(head) != _HEADER_WORDS * 8 or head[:8] != _MAGIC:
            raise RuntimeError(f"stop_requested: {what} is not a stop board (a header of {len(head)} bytes)")
        words = struct.unpack(f"<{_HEADER_WORDS}q", head)
        slots = words[1]
        if not 0 <= slots <= _MAX_SLOTS:
            raise RuntimeError(f"stop_requested: {what}: a stop board of {slots} slots")
        if a.slot >= slots:
            raise RuntimeError(f"stop_requested: {what} has {slots} slots; {STOP_SLOT} {a.slot} is none of them")
        at = (_HEADER_WORDS + a.slot) * 8
        mine = os.pread(a.fd, 8, at)
        if len(mine) != 8:
            raise RuntimeError(f"stop_requested: {what}: its {slots} slots are cut short")
        if struct.unpack("<q", mine)[0] != step:
            os.pwrite(a.fd, struct.pack("<q", step), at)
        stop, horizon, frozen = words[_STOP], words[_HORIZON], words[_FROZEN]
        if stop != _NONE:
            return ("stop" if step >= stop else "go"), stop, stop
        if step < horizon:
            return "go", horizon, _NONE
        if frozen:
            return "wait", horizon, _NONE
        horizon = _INT64_MAX if step > _INT64_MAX - ahead else step + ahead
        os.pwrite(a.fd, struct.pack("<q", horizon), _HORIZON * 8)
        return "go", horizon, _NONE
    finally:
        fcntl.flock(a.fd, fcntl.LOCK_UN)


def stop_requested(step):
    """True from the job's stop step on, False before it. `step` counts the rank's steps from 0
    and grows (the same step on every rank means the same point of the job). Costs a comparison
    for most steps and a lock of a local file for at most one step a millisecond; a rank waits (a
    millisecond at a time) only where launch is choosing the stop step at this step. Without
    launch (no MUSTER_STOP_FILE), always False. Thread-safe. Raises RuntimeError where the board
    cannot be read (again at each call), ValueError for a step below 0 or from 2**63, TypeError
    for one that is not an integer."""
    step = operator.index(step)  # an int (or numpy's), not a float
    if not 0 <= step <= _INT64_MAX:
        raise ValueError(f"stop_requested: a step of {step}: steps count from 0, below 2**63")
    a = _asker
    with a.lock:
        if not a.opened:
            _open(a)
        if a.fd < 0:
            return False
        if a.stop_step != _NONE:
            return step >= a.stop_step
        a.calls_since += 1
        if step < a.horizon:
            return False
        while True:
            now = time.monotonic()
            answer, horizon, a.stop_step = _ask(a, step, _ahead(a, now))
            if answer != "wait":
                if a.stop_step == _NONE:
                    a.horizon = max(a.horizon, horizon)
                return answer == "stop"
            a.lock.release()
            try:
                time.sleep(0.001)  # launch is choosing the stop step: ask again shortly
            finally:
                a.lock.acquire()
            if a.stop_step != _NONE:
                return step >= a.stop_step


def resumed_from_step():
    """Where a job that stopped cleanly starts again (a Slurm requeue, the same --rdzv_id again):
    the step its ranks stopped at (MUSTER_RESUMED_FROM_STEP, from launch's stop record), or None
    on a fresh start. A value that is not a step raises ValueError."""
    text = os.environ.get(RESUMED_FROM_STEP)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) > _INT64_MAX:
        raise ValueError(f"{RESUMED_FROM_STEP}={text!r} is not a step")
    return int(text)
