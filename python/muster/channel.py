"""Channel: tensors and bytes between the ranks of a job through files in a directory they all
see (local on one node, NFS across nodes), announced through the job's store. The files, the
store keys and the order of transfers are the C++ library's (worker/shared_dir_channel.h), so
C++ and Python ranks of one job exchange tensors both ways."""

import datetime
import errno
import mmap
import operator
import os
import shutil
import tempfile

import torch

from . import checksum, fileformat
from .env import JobEnv
from .errors import (INTERNAL, INVALID_ARGUMENT, UNAVAILABLE, ChannelDataLoss, ChannelError,
                     ChannelInvalid, ChannelNotShared, ChannelTimeout,
                     error_for_code)
from ._channel_parts import (_PROBE_KEY, _Payload, _Received, _SEGMENT, _Streamed, _ann_key,
                             _done_key, _early_key, _first_line, _hash_while, _os_error, _part_key,
                             _populate, _random64, _write_chunks)


class Channel:
    """Moves tensors and bytes between the ranks of the job through a shared directory.

    Creating it is collective: every rank checks that it sees a file rank 0 writes, and every
    rank gets an error naming the ranks that cannot. Transfers match by order, as MPI's: the
    n-th send from A to B with tag T is the n-th recv on B from A with tag T; collectives
    likewise per tag, and every rank must call each collective. Create one Channel per
    process and keep it (a second one in the same round would start counting transfers
    afresh); use it from one thread at a time.

    Files live under ``<dir>/<job id>/<round>/``, are written under a temporary name and
    renamed into place (a reader never sees half a file), and carry a checked header and an
    XXH3 checksum that the store announcement repeats. Received tensors are ordinary, writable
    CPU tensors on a private mapping of the file: no copy, and an in-place change copies only
    the pages it touches. The last receiver deletes the file.

    Errors (each names the file and the sending rank): ChannelTimeout (nothing announced within
    ``timeout``), ChannelDataLoss (a corrupted, truncated, foreign or missing file),
    ChannelDiskFull (the sender's disk is full; its receivers are told), ChannelNotShared (the
    directory is not shared by every rank), ChannelInvalid (a bad rank or dtype).

    ``dir``: default MUSTER_SHARED_DIR (launch --shared_dir; a private directory for a world
    of one started without launch). ``timeout``: seconds each receive waits. ``start_timeout``:
    seconds creation waits for every rank (default: ``timeout``). ``store``: default
    ``muster.store()``.
    """

    def __init__(self, dir=None, timeout=300.0, start_timeout=None, store=None, env=None):
        self._env = env if env is not None else JobEnv.from_environ()
        self._timeout = float(timeout)
        self._start_timeout = float(start_timeout) if start_timeout else self._timeout
        self._sequence = {}
        self._owned = None
        e = self._env
        if store is None:
            from .job_store import store as job_store
            store = job_store(timeout=max(self._timeout, self._start_timeout))
        self._store = store
        dir = dir or e.shared_dir
        if not dir and e.world_size == 1:
            # A world of one, not started by launch: a private directory, removed with the
            # channel.
            dir = self._owned = tempfile.mkdtemp(prefix="muster-channel-")
        if not dir and e.group_world_size > 1:
            raise ChannelNotShared(
                f"rank {e.rank}: no shared directory: this job spans {e.group_world_size} nodes "
                "and launch was given no --shared_dir; give every node's launch --shared_dir "
                "DIR on a filesystem they all share (NFS), or pass Channel(dir=...)")
        if not dir:
            raise ChannelNotShared("no shared directory: MUSTER_SHARED_DIR is not set (start "
                                   "the program with launch, or pass Channel(dir=...))")
        checksum.implementation()  # no XXH3 at all: say so now, not mid-transfer
        self._dir = dir
        job = e.job_id or e.run_id
        job_dir = os.path.join(dir, job)
        self._round_dir = os.path.join(job_dir, str(e.round))
        try:
            os.makedirs(self._round_dir, exist_ok=True)
        except OSError as err:
            raise ChannelNotShared(f"rank {e.rank}: cannot create the channel directory "
                                   f"{self._round_dir}: {err.strerror}") from err
        if e.local_rank == 0:
            # Leftovers of dead rounds go when a new round starts.
            for name in os.listdir(job_dir):
                if name.isdigit() and int(name) < e.round:
                    shutil.rmtree(os.path.join(job_dir, name), ignore_errors=True)
        self._probe()

    # -- properties and lifetime ----------------------------------------------------------

    @property
    def rank(self):
        return self._env.rank

    @property
    def world_size(self):
        return self._env.world_size

    @property
    def round_dir(self):
        """This round's folder of channel files."""
        return self._round_dir

    def close(self):
        """Removes a world of one's private directory; received tensors stay valid."""
        if self._owned:
            shutil.rmtree(self._owned, ignore_errors=True)
            self._owned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # -- tensors --------------------------------------------------------------------------

    def send(self, tensor, dst, tag=0):
        """Sends ``tensor`` (any device; it arrives on the CPU) to rank ``dst``."""
        self._send(lambda: _Payload.of_tensor(tensor), dst, tag, "p2p")

    def recv(self, src, tag=0):
        """The next tensor rank ``src`` sent this rank with ``tag``."""
        return self._recv(src, tag, "p2p").tensor()

    def broadcast(self, tensor, src, tag=0):
        """Every rank gets rank ``src``'s ``tensor`` (the others' argument is ignored; None
        will do). The root gets its own tensor back."""
        got = self._broadcast(lambda: _Payload.of_tensor(tensor), src, tag, "bcast")
        return tensor if got is None else got.tensor()

    def gather(self, tensor, dst, tag=0):
        """Rank ``dst`` gets every rank's tensor in rank order; the others get None."""
        got = self._gather(lambda: _Payload.of_tensor(tensor), dst, tag, "gather")
        return None if got is None else [tensor if r is None else r.tensor() for r in got]

    def all_gather(self, tensor, tag=0):
        """Every rank gets every rank's tensor, in rank order."""
        got = self._all_gather(lambda: _Payload.of_tensor(tensor), tag, "allgather")
        return [tensor if r is None else r.tensor() for r in got]

    # -- bytes ----------------------------------------------------------------------------

    def send_bytes(self, data, dst, tag=0):
        self._send(lambda: _Payload.of_bytes(data), dst, tag, "p2pb")

    def recv_bytes(self, src, tag=0):
        return self._recv(src, tag, "p2pb").data()

    def broadcast_bytes(self, data, src, tag=0):
        got = self._broadcast(lambda: _Payload.of_bytes(data), src, tag, "bcastb")
        return bytes(data) if got is None else got.data()

    def gather_bytes(self, data, dst, tag=0):
        got = self._gather(lambda: _Payload.of_bytes(data), dst, tag, "gatherb")
        return None if got is None else [bytes(data) if r is None else r.data() for r in got]

    def all_gather_bytes(self, data, tag=0):
        got = self._all_gather(lambda: _Payload.of_bytes(data), tag, "allgatherb")
        return [bytes(data) if r is None else r.data() for r in got]

    # -- the five patterns (``stream`` keeps tensors and bytes apart). A sender's payload is
    # made once the transfer is named, so that a bad argument is announced to the receivers
    # (they fail at once) and every rank's count of transfers stays in step.

    def _check_rank(self, what, r):
        try:
            ok = not isinstance(r, bool) and 0 <= operator.index(r) < self.world_size
        except TypeError:
            ok = False
        if not ok:
            raise ChannelInvalid(f"{what} rank {r!r} of {self.world_size}")
        return operator.index(r)

    @staticmethod
    def _check_tag(tag):
        try:
            if not isinstance(tag, bool):
                return operator.index(tag)
        except TypeError:
            pass
        raise ChannelInvalid(f"tag {tag!r} is not an integer")

    def _next_name(self, stream, direction="c"):
        # Sends and receives count apart: a rank that sends to itself must match its own sends.
        key = direction + stream
        n = self._sequence.get(key, 0)
        self._sequence[key] = n + 1
        return f"{stream}.{n}"

    def _send(self, make, dst, tag, stream):
        dst = self._check_rank("send to", dst)
        tag = self._check_tag(tag)
        self._publish(self._next_name(f"{stream}.{self.rank}.{dst}.{tag}", "s"), make, 1)

    def _recv(self, src, tag, stream):
        src = self._check_rank("recv from", src)
        tag = self._check_tag(tag)
        return self._fetch(self._next_name(f"{stream}.{src}.{self.rank}.{tag}", "r"), src)

    def _broadcast(self, make, root, tag, stream):
        root = self._check_rank("broadcast from", root)
        name = self._next_name(f"{stream}.{root}.{self._check_tag(tag)}")
        if self.rank == root:
            if self.world_size > 1:
                self._publish(name, make, self.world_size - 1)
            else:
                make()  # checked as elsewhere
            return None
        return self._fetch(name, root)

    def _gather(self, make, root, tag, stream):
        root = self._check_rank("gather to", root)
        base = self._next_name(f"{stream}.{root}.{self._check_tag(tag)}")
        if self.rank != root:
            self._publish(f"{base}.from{self.rank}", make, 1)
            return None
        make()  # the root's own is checked as the others'
        return [None if r == root else self._fetch(f"{base}.from{r}", r)
                for r in range(self.world_size)]

    def _all_gather(self, make, tag, stream):
        base = self._next_name(f"{stream}.{self._check_tag(tag)}")
        if self.world_size > 1:
            self._publish(f"{base}.from{self.rank}", make, self.world_size - 1)
        else:
            make()
        return [None if r == self.rank else self._fetch(f"{base}.from{r}", r)
                for r in range(self.world_size)]

    # -- files ----------------------------------------------------------------------------

    def _set(self, key, value, what, path):
        try:
            self._store.set(key, value)
        except Exception as e:  # noqa: BLE001 (torch raises RuntimeError for store failures)
            err = ChannelError(f"rank {self.rank}: {what} {path}: {_first_line(e)}", path,
                               self.rank)
            err.code = UNAVAILABLE
            raise err from e

    def _publish(self, name, make, receivers):
        """Writes the payload ``make()`` gives as transfer ``name`` and announces it. Whatever
        fails is announced too (its status code and message), so receivers fail at once."""
        me = self.rank
        path = os.path.join(self._round_dir, name + ".mt")
        tmp = os.path.join(self._round_dir, f".{name}.{os.getpid()}.tmp")
        state = {"early": False, "parts": 0, "segments": 0, "tmp": False}

        def early(value):
            self._set(_early_key(name), value, "starting", path)
            state["early"] = True

        try:
            try:
                p = make()
            except (TypeError, ValueError) as e:
                e.args = (f"rank {me}: {e} (sending {path})",) + e.args[1:]
                if isinstance(e, ChannelError):
                    e.path, e.src = path, me
                raise
            if len(p.shape) > fileformat.MAX_DIMS:
                raise ChannelInvalid(f"rank {me}: a tensor of {len(p.shape)} dimensions is more "
                                     f"than {fileformat.MAX_DIMS} ({path})", path=path, src=me)
            # A large payload on one node is streamed: receivers check each segment as it
            # lands. Across nodes they wait for the whole file (a network file system shows
            # another node's writes only once the file is closed).
            segments = 0
            if self._env.group_world_size <= 1 and p.nbytes > _SEGMENT:
                segments = (p.nbytes + _SEGMENT - 1) // _SEGMENT
            state["segments"] = segments
            transfer_id = _random64()
            head_size = fileformat.header_bytes(len(p.shape))

            def write():
                os.lseek(fd, head_size, os.SEEK_SET)
                if not segments:
                    _write_chunks(fd, p.view)
                for k in range(segments):
                    _write_chunks(fd, p.view[k * _SEGMENT:(k + 1) * _SEGMENT])
                    self._set(_part_key(name, k), b"1", "announcing a segment of", path)
                    state["parts"] = k + 1

            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            state["tmp"] = True
            try:
                # Its full size first: receivers map the file as it is written.
                os.ftruncate(fd, head_size + p.nbytes)
                early((f"S|{tmp}|{head_size}|{p.nbytes}|{_SEGMENT}" if segments
                       else "-").encode())
                digest = _hash_while(p, write)
                head = fileformat.pack_header(p.kind, transfer_id, p.nbytes, digest,
                                              p.dtype_code, p.shape, me)
                if os.pwrite(fd, head, 0) != len(head):
                    raise OSError(errno.EIO, "short write of the header")
            finally:
                os.close(fd)
            os.rename(tmp, path)
            state["tmp"] = False
            self._set(_ann_key(name), (f"{path}|{transfer_id:016x}|{p.nbytes}|"
                                       f"{digest:016x}|{receivers}").encode(), "announcing", path)
        except BaseException as e:
            if isinstance(e, ChannelError):
                error = e
            elif isinstance(e, OSError):
                error = _os_error(e, f"rank {me}: writing {path}", path, me)
            else:
                code = INVALID_ARGUMENT if isinstance(e, (TypeError, ValueError)) else INTERNAL
                error = error_for_code(code, f"rank {me}: {type(e).__name__}: {e}", path, me)
            self._fail(name, error, state, tmp, path)
            if error is e or not isinstance(e, OSError):
                raise
            raise error from e

    def _fail(self, name, error, state, tmp, path):
        """A send failed: its files go, and its receivers learn why (best effort: the store
        may be what failed)."""
        for leftover in ([tmp] if state["tmp"] else []) + [path]:
            try:
                os.unlink(leftover)
            except OSError:
                pass
        try:
            if not state["early"]:
                self._store.set(_early_key(name), b"-")
            # Receivers following the segments stop at the first one marked failed.
            for k in range(state["parts"], state["segments"]):
                self._store.set(_part_key(name, k), b"E")
            self._store.set(_ann_key(name), f"ERROR|{error.code}|{error}".encode())
        except Exception:  # noqa: BLE001 (the store is gone too: the receivers time out)
            pass

    def _wait_get(self, key, expected, src):
        """The value of ``key`` once it exists, within the receive timeout."""
        try:
            self._store.wait([key], datetime.timedelta(seconds=self._timeout))
            return self._store.get(key).decode("utf-8", "replace")
        except Exception as e:  # noqa: BLE001 (RuntimeError or a 2.x DistStoreError)
            why = _first_line(e)
            if "imeout" in why or "timed out" in why:
                raise ChannelTimeout(f"rank {src} did not announce {expected} within "
                                     f"{self._timeout:.1f} s (rank {self.rank} waiting)",
                                     expected, src) from e
            raise ChannelError(f"rank {self.rank} waiting for {expected} from rank {src}: the "
                               f"store failed: {why}", expected, src) from e

    def _fetch(self, name, src):
        expected = os.path.join(self._round_dir, name + ".mt")

        def malformed(what, text):
            return ChannelDataLoss(f"the {what} of {expected} by rank {src} is malformed: "
                                   f"{text!r}", expected, src)

        early = self._wait_get(_early_key(name), expected, src)
        segments, streamed, streamed_bytes = 0, None, -1
        if early.startswith("S|"):
            f = early.split("|")
            try:
                tmp, head, nbytes, seg = f[1], int(f[2]), int(f[3]), int(f[4])
            except (IndexError, ValueError):
                raise malformed("start", early) from None
            if len(f) != 5 or head < fileformat.HEADER_SIZE or nbytes < 1 or seg < 4096 or \
                    seg % 4096:
                raise malformed("start", early)
            segments, streamed_bytes = (nbytes + seg - 1) // seg, nbytes
            streamed = self._follow(name, tmp, head, nbytes, seg, segments, expected, src)
        elif early != "-":
            raise malformed("start", early)
        got = None
        try:
            announcement = self._wait_get(_ann_key(name), expected, src)
            f = announcement.split("|", 4)
            if len(f) >= 3 and f[0] == "ERROR":
                if not f[1].isdigit() or not 0 < int(f[1]) <= 16:
                    raise malformed("announcement", announcement)
                raise error_for_code(int(f[1]), f"rank {src} could not send {expected}: "
                                     + "|".join(f[2:]), expected, src)
            if len(f) != 5:
                raise malformed("announcement", announcement)
            path = f[0]
            try:
                transfer_id, nbytes = int(f[1], 16), int(f[2])
                digest, receivers = int(f[3], 16), int(f[4])
            except ValueError:
                raise malformed("announcement", announcement) from None
            if receivers < 1 or nbytes < 0:
                raise malformed("announcement", announcement)

            def bad(why):
                return ChannelDataLoss(f"{path} from rank {src}: {why}", path, src)

            got = self._check(path, transfer_id, nbytes, digest, bad, streamed)
        finally:
            # The followed mapping is the received one's, or is of no further use.
            if streamed is not None and (got is None or got.mapping is not streamed.mapping):
                streamed.mapping.close()
        # The last receiver deletes the file; the mapping keeps the data. Across nodes the
        # file is left to the round's clean-up (launch removes the round's directory): another
        # node may still map it, and a network file system does not keep an unlinked file.
        try:
            last = self._store.add(_done_key(name), 1) >= receivers
        except Exception:  # noqa: BLE001 (clean-up only)
            return got
        if last:
            if self._env.group_world_size <= 1:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            # Part keys are counted from the start only if it agrees with the announcement.
            parts = segments if streamed_bytes == nbytes else 0
            try:
                for key in [_ann_key(name), _done_key(name), _early_key(name)] + \
                        [_part_key(name, k) for k in range(parts)]:
                    self._store.delete_key(key)
            except Exception:  # noqa: BLE001 (clean-up only)
                pass
        return got

    def _follow(self, name, tmp, head, nbytes, seg, segments, expected, src):
        """Checksums a streamed file's segments as the sender announces them. None when the
        file is gone already (renamed: the whole file is checked instead) or the sender
        failed (its announcement says why)."""
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size != head + nbytes:
                return None
            mapping = mmap.mmap(fd, head + nbytes, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        h = checksum.hasher()
        try:
            for k in range(segments):
                if self._wait_get(_part_key(name, k), expected, src) != "1":
                    mapping.close()
                    return None
                lo, hi = head + k * seg, head + min((k + 1) * seg, nbytes)
                _populate(mapping, lo, hi)
                with memoryview(mapping) as view:
                    part = view[lo:hi]
                    try:
                        h.update(part)
                    finally:
                        part.release()
        except BaseException:
            mapping.close()
            raise
        return _Streamed(mapping, st.st_dev, st.st_ino, head, h.intdigest())

    def _check(self, path, transfer_id, nbytes, digest, bad, streamed=None):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise bad(f"cannot open it: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size < fileformat.HEADER_SIZE:
                raise bad(f"truncated: {size} bytes, not even a header")
            pre = None
            if streamed is not None and (st.st_dev, st.st_ino) == (streamed.dev, streamed.ino) \
                    and size == len(streamed.mapping):
                # The file this rank followed as it was written: its payload is checksummed.
                mapping, pre = streamed.mapping, streamed
            else:
                # A private, writable mapping: the received tensor is an ordinary tensor that
                # in-place ops may change (copy on write, page by page); the file and the
                # other receivers never see it.
                try:
                    mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
                except (OSError, ValueError) as e:
                    raise bad(f"cannot map it: {e}") from e
                _populate(mapping, 0, size)
        finally:
            os.close(fd)
        try:
            return self._check_mapped(mapping, size, transfer_id, nbytes, digest, bad, pre)
        except BaseException:
            if pre is None:  # a followed mapping is the caller's to close
                mapping.close()
            raise

    @staticmethod
    def _check_mapped(mapping, size, transfer_id, nbytes, digest, bad, pre):
        h = fileformat.Header(mapping)
        if h.magic != fileformat.MAGIC:
            raise bad("not a muster channel file (bad magic)")
        if h.version != fileformat.VERSION:
            raise bad(f"format version {h.version} is not {fileformat.VERSION}")
        if h.transfer_id != transfer_id:
            raise bad("a foreign file: its transfer id is not the one rank announced")
        if (h.payload_bytes != nbytes or h.ndim > fileformat.MAX_DIMS
                or h.header_bytes < fileformat.HEADER_SIZE + 8 * h.ndim
                or h.header_bytes > size):
            raise bad("its header disagrees with the announcement")
        if h.region_checksum(mapping) != h.header_checksum:
            raise bad("corrupted: the header's checksum does not match")
        if size != h.header_bytes + nbytes:
            raise bad(f"truncated or padded: {size} bytes where {h.header_bytes + nbytes} "
                      "were announced")
        if pre is not None and pre.head == h.header_bytes:
            actual = pre.digest
        else:
            with memoryview(mapping) as view:
                payload = view[h.header_bytes:h.header_bytes + nbytes]
                try:
                    actual = checksum.xxh3_64(payload)
                finally:
                    payload.release()
        if actual != digest or h.checksum != digest:
            raise bad("corrupted: the checksum does not match")
        r = _Received()
        r.mapping, r.offset, r.nbytes, r.kind = mapping, h.header_bytes, nbytes, h.kind
        r.shape = h.shape(mapping)
        r.numel = 1
        for d in r.shape:
            if d < 0:
                raise bad(f"its shape has a negative dimension ({d})")
            r.numel *= d
        if r.numel >= 1 << 63:
            raise bad("its shape's element count overflows")
        r.dtype = torch.uint8
        if h.kind == fileformat.KIND_TENSOR:
            r.dtype = fileformat.DTYPE_OF_CODE.get(h.dtype_code)
            if r.dtype is None:
                raise bad(f"unknown dtype code {h.dtype_code}")
            if r.numel * torch.empty((), dtype=r.dtype).element_size() != nbytes:
                raise bad("its shape and dtype do not add up to its length")
        return r

    # -- the start-up probe ---------------------------------------------------------------

    def _probe(self):
        e = self._env
        if e.world_size == 1:
            return
        timeout = datetime.timedelta(seconds=self._start_timeout)
        path = os.path.join(self._round_dir, ".probe")
        s = self._store
        try:
            if e.rank == 0:
                nonce = f"{_random64():016x}"
                tmp = f"{path}.{os.getpid()}.tmp"
                try:
                    with open(tmp, "w") as f:
                        f.write(nonce)
                    os.rename(tmp, path)
                except OSError as err:
                    raise _os_error(err, f"rank 0: writing the probe file {path}") from err
                s.set(_PROBE_KEY, nonce.encode())
            s.wait([_PROBE_KEY], timeout)
            nonce = s.get(_PROBE_KEY).decode()
            try:
                with open(path, "rb") as f:
                    seen = f.read(64).decode("ascii", "replace")
            except OSError:
                seen = ""
            s.set(f"{_PROBE_KEY}/{e.rank}", b"ok" if seen == nonce else b"no")
            keys = [f"{_PROBE_KEY}/{r}" for r in range(e.world_size)]
            s.wait(keys, timeout)
            blind = [r for r in range(e.world_size) if s.get(keys[r]) != b"ok"]
            if s.add(f"{_PROBE_KEY}/done", 1) == e.world_size:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        except ChannelError:
            raise
        except Exception as err:  # noqa: BLE001 (RuntimeError from the store)
            raise ChannelTimeout(f"rank {e.rank}: checking that {self._dir} is shared failed: "
                                 f"{_first_line(err)}") from err
        if blind:
            raise ChannelNotShared(
                f"the shared directory {self._dir} is not shared by every rank: "
                f"rank{'s' if len(blind) > 1 else ''} {', '.join(map(str, blind))} cannot see "
                f"{path} written by rank 0 (is it local to each node? give launch --shared_dir "
                "a path on a shared filesystem)", path=path, src=0)
