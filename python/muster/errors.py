"""The channel's errors. Each names the file and the sending rank; ``code`` is the status code
the C++ library uses for the same fault (absl's numbering, which the store announcement of a
failed send carries), so a C++ sender's failure reaches a Python receiver as the same class."""

INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15


class ChannelError(RuntimeError):
    """A transfer failed. ``path``: the channel file; ``src``: the sending rank (when known)."""

    code = INTERNAL

    def __init__(self, message, path=None, src=None):
        super().__init__(message)
        self.path = path
        self.src = src


class ChannelTimeout(ChannelError, TimeoutError):
    """Nothing was announced in time (the sender is late, hung or dead)."""

    code = DEADLINE_EXCEEDED


class ChannelDataLoss(ChannelError):
    """The file is corrupted, truncated, foreign, missing or not a channel file."""

    code = DATA_LOSS


class ChannelDiskFull(ChannelError):
    """The sender's file system is full (the receivers are told too)."""

    code = RESOURCE_EXHAUSTED


class ChannelNotShared(ChannelError):
    """The directory is not one every rank of the job sees, or there is none."""

    code = FAILED_PRECONDITION


class ChannelInvalid(ChannelError, ValueError):
    """The call itself is wrong: a rank out of range, a dtype the format cannot carry."""

    code = INVALID_ARGUMENT


_BY_CODE = {c.code: c for c in (ChannelTimeout, ChannelDataLoss, ChannelDiskFull,
                                ChannelNotShared, ChannelInvalid)}


def error_for_code(code, message, path=None, src=None):
    """The error class of a status code (ChannelError for the codes without a class)."""
    error = _BY_CODE.get(code, ChannelError)(message, path=path, src=src)
    error.code = code
    return error
