"""The channel's parts below the Channel class (channel.py): store keys, payloads as they are
written and read, and the file-writing and checksum helpers. Internal to the package."""

import ctypes
import errno
import mmap
import os
import threading

import torch

from . import checksum, fileformat
from .errors import ChannelDiskFull, ChannelError, ChannelInvalid

_CHUNK = 8 << 20
_PARALLEL_HASH = 32 << 20  # payloads from this size hash on a thread of their own
_SEGMENT = 64 << 20  # a streamed file's unit: receivers check it while the next is written
_MADV_POPULATE_READ = 22  # Linux 5.14; older kernels refuse it and get MADV_WILLNEED
_PROBE_KEY = "muster/chan/probe"


def _ann_key(name):
    return "muster/chan/ann/" + name


def _done_key(name):
    return "muster/chan/done/" + name


# Before writing, a sender sets the early key: "-" (wait for the announcement), or, for a large
# payload on one node, "S|<temporary file>|<header bytes>|<payload bytes>|<segment bytes>":
# the file has its full size already and part key k says "1" once segment k is written ("E":
# the sender failed; its announcement says why). The C++ library sets "-" and deletes these
# keys as the last receiver, as this one does.
def _early_key(name):
    return "muster/chan/early/" + name


def _part_key(name, k):
    return f"muster/chan/part/{name}/{k}"


def _populate(mapping, lo, hi):
    """Maps pages [lo, hi) of ``mapping`` at once, read-only until written: far cheaper than
    a fault per 4 KiB."""
    lo -= lo % mmap.PAGESIZE
    try:
        mapping.madvise(_MADV_POPULATE_READ, lo, hi - lo)
    except OSError:
        mapping.madvise(mmap.MADV_WILLNEED, lo, hi - lo)


def _first_line(e):
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__


def _os_error(e, what, path=None, src=None):
    cls = ChannelDiskFull if e.errno in (errno.ENOSPC, errno.EDQUOT) else ChannelError
    why = e.strerror or str(e) or type(e).__name__
    return cls(f"{what}: {why}", path=path, src=src)


class _Payload:
    """What a send writes: a tensor's memory or bytes, with the header's description."""

    __slots__ = ("kind", "dtype_code", "shape", "view", "nbytes", "keep")

    @staticmethod
    def of_tensor(tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        p = _Payload()
        p.kind = fileformat.KIND_TENSOR
        if tensor.layout != torch.strided:
            raise ChannelInvalid(f"a {tensor.layout} tensor cannot be sent; send a dense one "
                                 "(e.g. tensor.to_dense())")
        t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
        p.dtype_code = fileformat.CODE_OF_DTYPE.get(t.dtype)
        if p.dtype_code is None:
            raise ChannelInvalid(f"a {t.dtype} tensor cannot be sent through the channel")
        p.shape = list(t.shape)
        p.nbytes = t.numel() * t.element_size()
        p.keep = t  # the memory the view points at
        p.view = memoryview((ctypes.c_char * p.nbytes).from_address(t.data_ptr())).cast("B") \
            if p.nbytes else memoryview(b"")
        return p

    @staticmethod
    def of_bytes(data):
        if isinstance(data, str):
            raise TypeError("expected bytes, got str: encode it (e.g. text.encode())")
        p = _Payload()
        p.kind = fileformat.KIND_BYTES
        p.dtype_code = 0
        p.keep = data
        p.view = memoryview(data).cast("B")
        p.nbytes = len(p.view)
        p.shape = [p.nbytes]
        return p


class _Streamed:
    """A file followed as it was written: its mapping and identity, and the payload's checksum."""

    __slots__ = ("mapping", "dev", "ino", "head", "digest")

    def __init__(self, mapping, dev, ino, head, digest):
        self.mapping, self.dev, self.ino, self.head, self.digest = mapping, dev, ino, head, digest


class _Received:
    """A checked file, mapped privately: writing to it copies the page, never the file."""

    __slots__ = ("mapping", "offset", "nbytes", "kind", "dtype", "shape", "numel")

    def tensor(self):
        if self.nbytes == 0:
            self.mapping.close()
            return torch.empty(self.shape, dtype=self.dtype)
        # The tensor holds the mapping: it stays valid after the file is gone.
        flat = torch.frombuffer(self.mapping, dtype=self.dtype, count=self.numel,
                                offset=self.offset)
        return flat.view(self.shape)

    def data(self):
        with memoryview(self.mapping) as view:
            out = bytes(view[self.offset:self.offset + self.nbytes])
        self.mapping.close()
        return out


def _write_chunks(fd, view):
    for off in range(0, len(view), _CHUNK):
        _write_all(fd, view[off:off + _CHUNK])


def _hash_while(payload, work):
    """XXH3 of ``payload``'s bytes, computed beside ``work()`` (which reads the same memory):
    on a thread of its own for large payloads, since both the checksum and the writes release
    the GIL (a 1 GiB send takes the time of its writes, not of writes plus hashing)."""
    view = payload.view
    if len(view) < _PARALLEL_HASH:
        work()
        return checksum.xxh3_64(view)
    result = []

    def run(owner=payload):  # holds the memory the view points at while the thread reads it
        try:
            h = checksum.hasher()
            for off in range(0, len(view), _CHUNK):
                h.update(view[off:off + _CHUNK])
            result.append(h.intdigest())
        except BaseException as e:  # noqa: BLE001 (handed to the sender's thread)
            result.append(e)

    thread = threading.Thread(target=run, name="muster-checksum", daemon=True)
    thread.start()
    try:
        work()
    finally:
        thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _write_all(fd, data):
    view = memoryview(data)
    while len(view):
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "the file system took no bytes")
        view = view[n:]


def _random64():
    """A transfer id or nonce: from the OS, so that ranks seeding ``random`` alike (as
    reproducible training does) still get their own."""
    return int.from_bytes(os.urandom(8), "little")
