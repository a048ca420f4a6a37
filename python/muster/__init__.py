"""muster for Python workers: the shared-directory channel, the job's store, progress and stops.

    import muster
    chan = muster.Channel()                  # collective: every rank of the job
    if chan.rank == 0:
        chan.send(torch.randn(1024, 1024), dst=1)
    elif chan.rank == 1:
        t = chan.recv(src=0)                 # an ordinary CPU tensor on the mapped file
    muster.progress()                        # launch --hang_timeout counts it as progress
    start = muster.resumed_from_step() or 0  # where a requeued job stopped
    if muster.stop_requested(step):          # the same step on every rank, on a notice
        save(step)
    muster.store().set("key", b"value")      # the job's store (a torch.distributed.Store)

Pure Python on top of torch (1.13 and later) and the standard library; the channel's checksum
uses python3-xxhash when installed, else libxxhash through ctypes.
"""

from .errors import (ChannelDataLoss, ChannelDiskFull, ChannelError, ChannelInvalid,
                     ChannelNotShared, ChannelTimeout)
from .progress import progress
from .stop import resumed_from_step, stop_requested

__version__ = "0.1.0"

__all__ = ["Channel", "ChannelError", "ChannelTimeout", "ChannelDataLoss", "ChannelDiskFull",
           "ChannelNotShared", "ChannelInvalid", "JobEnv", "progress", "resumed_from_step",
           "stop_requested", "store", "__version__"]

# torch loads on first use of what needs it: `import muster; muster.progress()` costs
# milliseconds, and a rank's heartbeats can start before its imports are done.
_LAZY = {"Channel": ".channel", "store": ".job_store", "JobEnv": ".env"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'muster' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
