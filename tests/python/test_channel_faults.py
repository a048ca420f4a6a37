"""muster.Channel's faults, each named with the file and the sending rank: ranks are threads of
this process sharing torch's HashStore and a real directory (the processes, launch and the
TCPStore front are in test_under_launch.py). Run with Debian's python3 and torch 1.13."""

import errno
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
from unittest import mock

import torch
import torch.distributed as dist

import muster
from muster import channel as channel_module
from muster import fileformat
from muster.env import JobEnv


def env(rank, world, **extra):
    e = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
         "LOCAL_WORLD_SIZE": str(world), "MUSTER_JOB_ID": "job", "MUSTER_ROUND": "0"}
    e.update(extra)
    return JobEnv.from_environ(e)


def together(*calls):
    """Runs the calls at once (ranks' collective steps); their results, or raises the first
    error."""
    out, errors = [None] * len(calls), []

    def run(i):
        try:
            out[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if any(t.is_alive() for t in threads):
        raise AssertionError("a rank is still running after 120 s")
    if errors:
        raise errors[0]
    return out


class Faults(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-pyfaults-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.store = dist.HashStore()

    def channels(self, world=2, timeout=3.0, dirs=None):
        return together(*[
            (lambda r=r: muster.Channel(dir=dirs[r] if dirs else self.dir, env=env(r, world),
                                        store=self.store, timeout=timeout))
            for r in range(world)])

    def small_disk(self, size, timeout):
        """A tmpfs of ``size`` (needs root) and two ranks' channels on it."""
        if os.geteuid() != 0:
            self.skipTest("mounting a tmpfs needs root")
        small = os.path.join(self.dir, "small")
        os.mkdir(small)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", small]).returncode:
            self.skipTest("cannot mount a tmpfs here")
        self.addCleanup(subprocess.run, ["umount", "-l", small])
        return small, self.channels(timeout=timeout, dirs=[small, small])

    def failed_streamed_send(self, c0, c1):
        """Rank 1 streams 192 MiB to rank 0, which follows it; both must fail, and soon.
        The two errors, sender's first."""
        outcomes = [None, None]

        def attempt(i, call):
            try:
                call()
            except muster.ChannelError as e:
                outcomes[i] = e

        start = time.monotonic()
        together(lambda: attempt(0, lambda: c1.send(torch.ones(48 << 20), 0)),
                 lambda: attempt(1, lambda: c0.recv(1)))
        self.assertLess(time.monotonic() - start, 30, "the receiver was not kept waiting")
        return [e for e in outcomes if e is not None]

    def file_of(self, name):
        return os.path.join(self.dir, "job", "0", name)

    def assertNames(self, err, path, rank):
        text = str(err.exception)
        self.assertIn(path, text)
        self.assertIn(f"rank {rank}", text)
        self.assertEqual(err.exception.src, rank)

    def test_corrupted_payload_is_refused(self):
        c0, c1 = self.channels()
        c1.send(torch.arange(1000.0), 0)
        path = self.file_of("p2p.1.0.0.0.mt")
        with open(path, "r+b") as f:
            f.seek(-7, os.SEEK_END)
            f.write(b"\xff")
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("corrupted: the checksum does not match", str(err.exception))
        self.assertNames(err, path, 1)

    def test_corrupted_header_and_shape_are_refused(self):
        c0, c1 = self.channels()
        # ndim (offset 44) past the format's 64; then a byte of the shape after the header.
        for k, (offset, byte, why) in enumerate((
                (44, b"\x50", "its header disagrees with the announcement"),
                (fileformat.HEADER_SIZE + 3, b"\x07",
                 "corrupted: the header's checksum does not match"))):
            c1.send(torch.ones(2, 3), 0)
            path = self.file_of(f"p2p.1.0.0.{k}.mt")
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(byte)
            with self.assertRaises(muster.ChannelDataLoss) as err:
                c0.recv(1)
            self.assertIn(why, str(err.exception))
            self.assertNames(err, path, 1)

    def test_truncated_file_is_refused(self):
        c0, c1 = self.channels()
        c1.send(torch.arange(4096, dtype=torch.int64), 0)
        path = self.file_of("p2p.1.0.0.0.mt")
        os.truncate(path, os.path.getsize(path) - 100)
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("truncated or padded", str(err.exception))
        self.assertNames(err, path, 1)
        # Shorter than a header.
        c1.send(torch.ones(3), 0)
        path = self.file_of("p2p.1.0.0.1.mt")
        os.truncate(path, 10)
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("truncated: 10 bytes, not even a header", str(err.exception))

    def test_foreign_file_with_the_same_name_is_refused(self):
        c0, c1 = self.channels()
        c1.send(torch.ones(8), 0)
        c1.send(torch.ones(8), 0)
        # Another transfer's file (another job, a stale round) put in the first one's place.
        os.replace(self.file_of("p2p.1.0.0.1.mt"), self.file_of("p2p.1.0.0.0.mt"))
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("a foreign file", str(err.exception))
        self.assertNames(err, self.file_of("p2p.1.0.0.0.mt"), 1)

    def test_a_file_that_is_not_a_channel_file_is_refused(self):
        c0, c1 = self.channels()
        c1.send(torch.ones(8), 0)
        path = self.file_of("p2p.1.0.0.0.mt")
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 this is a zip file, or anything else" * 4)
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("not a muster channel file", str(err.exception))
        self.assertNames(err, path, 1)

    def test_missing_file_is_refused(self):
        c0, c1 = self.channels()
        c1.send(torch.ones(8), 0)
        path = self.file_of("p2p.1.0.0.0.mt")
        os.unlink(path)
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("cannot open it: No such file or directory", str(err.exception))
        self.assertNames(err, path, 1)

    def test_missing_announcement_times_out_naming_the_sender(self):
        c0, _ = self.channels(timeout=1.0)
        with self.assertRaises(muster.ChannelTimeout) as err:
            c0.recv(1, tag=5)
        self.assertIn("rank 1 did not announce", str(err.exception))
        self.assertIn("within 1.0 s (rank 0 waiting)", str(err.exception))
        self.assertNames(err, self.file_of("p2p.1.0.5.0.mt"), 1)
        self.assertIsInstance(err.exception, TimeoutError)

    def test_malformed_announcement_is_refused(self):
        c0, _ = self.channels()
        self.store.set("muster/chan/early/p2p.1.0.0.0", b"-")
        self.store.set("muster/chan/ann/p2p.1.0.0.0", b"/etc/passwd|zz")
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("is malformed", str(err.exception))

    def test_full_disk_fails_the_sender_and_tells_the_receiver(self):
        small, (c0, c1) = self.small_disk("1m", timeout=5)
        with self.assertRaises(muster.ChannelDiskFull) as sent:
            c1.send(torch.ones(1 << 20), 0)  # 4 MiB into 1 MiB
        self.assertIn("rank 1: writing", str(sent.exception))
        self.assertIn("No space left on device", str(sent.exception))
        with self.assertRaises(muster.ChannelDiskFull) as got:
            c0.recv(1)
        self.assertIn("rank 1 could not send", str(got.exception))
        self.assertIn("p2p.1.0.0.0.mt", str(got.exception))
        self.assertEqual(os.listdir(os.path.join(small, "job", "0")), [],
                         "no partial file is left behind")

    def follow(self, receiver, fail_at=None):
        """Makes rank 1's streamed send wait until ``receiver`` follows it (waits for a segment
        of the file it mapped), whatever the load; with ``fail_at`` its write of that segment
        fails with ENOSPC. The part-key values the receiver read, in order."""
        following, seen, writes = threading.Event(), [], []
        real_wait, real_write = receiver._wait_get, channel_module._write_chunks

        def wait_get(key, *args):
            if key.startswith("muster/chan/part/"):
                following.set()
                seen.append(real_wait(key, *args))
                return seen[-1]
            return real_wait(key, *args)

        def write_chunks(fd, view):
            writes.append(len(view))
            if len(writes) == 1:
                self.assertTrue(following.wait(120), "the receiver never followed the file")
            if len(writes) == fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_write(fd, view)

        return seen, mock.patch.multiple(receiver, _wait_get=wait_get), \
            mock.patch.object(channel_module, "_write_chunks", write_chunks)

    def test_a_streamed_transfer_is_checked_as_it_lands_and_leaves_no_keys(self):
        c0, c1 = self.channels(timeout=60)
        keys_before = self.store.num_keys()
        sent = torch.arange(50 << 20, dtype=torch.int32)  # 200 MiB: 4 segments
        seen, gate, writes = self.follow(c0)
        with gate, writes:
            got = together(lambda: c1.send(sent, 0), lambda: c0.recv(1))[1]
        self.assertTrue(torch.equal(got, sent))
        self.assertEqual(seen, ["1"] * 4, "the receiver checked every segment as it landed")
        self.assertEqual(self.store.num_keys(), keys_before, "the last receiver deletes the "
                         "announcement, the counter, the start and every segment's key")
        self.assertEqual(os.listdir(os.path.join(self.dir, "job", "0")), [])
        got.add_(1)  # the mapping it was followed on is an ordinary tensor
        self.assertEqual(got[-1].item(), (50 << 20))

    def test_a_failed_write_in_the_middle_of_a_streamed_send_stops_its_receiver(self):
        c0, c1 = self.channels(timeout=60)
        seen, gate, writes = self.follow(c0, fail_at=2)
        with gate, writes:
            outcomes = self.failed_streamed_send(c0, c1)
        self.assertEqual([type(e) for e in outcomes], [muster.ChannelDiskFull] * 2)
        self.assertEqual(seen, ["1", "E"], "the receiver stopped at the failed segment")
        self.assertEqual(os.listdir(os.path.join(self.dir, "job", "0")), [])

    def test_a_file_that_cannot_be_sized_fails_the_send_and_tells_the_receiver(self):
        c0, c1 = self.channels(timeout=60)
        with mock.patch.object(channel_module.os, "ftruncate",
                               side_effect=OSError(errno.EFBIG, "File too large")):
            with self.assertRaises(muster.ChannelError) as sent:
                c1.send(torch.ones(4), 0)
        self.assertIn("File too large", str(sent.exception))
        start = time.monotonic()
        with self.assertRaises(muster.ChannelError) as told:
            c0.recv(1)
        self.assertLess(time.monotonic() - start, 30)
        self.assertIn("rank 1 could not send", str(told.exception))
        self.assertIn("File too large", str(told.exception))

    def test_a_streamed_file_corrupted_after_it_was_written_is_refused(self):
        c0, c1 = self.channels(timeout=60)
        c1.send(torch.arange(40 << 20, dtype=torch.int32), 0)  # 160 MiB, followed by nobody
        path = self.file_of("p2p.1.0.0.0.mt")
        with open(path, "r+b") as f:
            f.seek(100 << 20)
            f.write(b"\x01")
        with self.assertRaises(muster.ChannelDataLoss) as err:
            c0.recv(1)
        self.assertIn("corrupted: the checksum does not match", str(err.exception))
        self.assertNames(err, path, 1)

    def test_disk_full_in_the_middle_of_a_streamed_send_stops_its_receiver(self):
        small, (c0, c1) = self.small_disk("100m", timeout=60)
        outcomes = self.failed_streamed_send(c0, c1)
        self.assertEqual(len(outcomes), 2)
        for e in outcomes:
            self.assertIsInstance(e, muster.ChannelDiskFull)
            self.assertIn("p2p.1.0.0.0.mt", str(e))
        self.assertEqual(os.listdir(os.path.join(small, "job", "0")), [])

    def test_directory_that_is_not_shared_is_caught_at_start(self):
        dirs = [os.path.join(self.dir, f"node{r}") for r in range(3)]
        for d in dirs:
            os.mkdir(d)
        dirs[0] = dirs[1]  # ranks 0 and 1 share; rank 2 has its own
        errors = []

        def make(r):
            try:
                muster.Channel(dir=dirs[r], env=env(r, 3), store=self.store, timeout=5)
            except muster.ChannelNotShared as e:
                errors.append(str(e))

        together(*[(lambda r=r: make(r)) for r in range(3)])
        self.assertEqual(len(errors), 3, "every rank is told")
        for e in errors:
            self.assertIn("is not shared by every rank: rank 2 cannot see", e)

    def test_bad_calls_are_clear_errors_and_the_receivers_are_told(self):
        c0, c1 = self.channels()
        with self.assertRaises(muster.ChannelInvalid):
            c0.send(torch.ones(1), 2)  # no such rank: nothing is named or sent
        with self.assertRaises(muster.ChannelInvalid):
            c0.recv(-1)
        with self.assertRaises(muster.ChannelInvalid):
            c0.send(torch.ones(1), 1, tag=1.5)
        # Each bad payload is a transfer that failed: the receiver learns why, in order, and
        # the two ranks' counts stay in step for what follows.
        with self.assertRaises(TypeError) as not_tensor:
            c0.send([1, 2], 1)
        with self.assertRaises(muster.ChannelInvalid) as sparse:
            c0.send(torch.ones(2, 2).to_sparse(), 1)
        with self.assertRaises(muster.ChannelInvalid) as dims:
            c0.send(torch.ones([1] * 65), 1)  # more dimensions than the format holds
        with self.assertRaises(TypeError):
            c0.send_bytes("text", 1)
        c0.send(torch.full((2,), 7.0), 1)
        self.assertIn("expected a torch.Tensor, got list", str(not_tensor.exception))
        self.assertIn("p2p.0.1.0.0.mt", str(not_tensor.exception))
        self.assertIn("sparse", str(sparse.exception))
        self.assertEqual((sparse.exception.src, sparse.exception.path),
                         (0, self.file_of("p2p.0.1.0.1.mt")))
        self.assertIn("65 dimensions", str(dims.exception))
        for why in ("expected a torch.Tensor", "sparse", "65 dimensions"):
            with self.assertRaises(muster.ChannelInvalid) as told:
                c1.recv(0)
            self.assertIn("rank 0 could not send", str(told.exception))
            self.assertIn(why, str(told.exception))
        with self.assertRaises(muster.ChannelInvalid) as told:
            c1.recv_bytes(0)
        self.assertIn("encode it", str(told.exception))
        self.assertTrue(torch.equal(c1.recv(0), torch.full((2,), 7.0)))
        self.assertEqual(os.listdir(os.path.join(self.dir, "job", "0")), [])

    def test_a_failing_checksum_thread_fails_the_send_and_tells_the_receiver(self):
        from muster import checksum
        c0, c1 = self.channels()
        real = checksum.hasher

        def broken():
            h = real()

            class Broken:
                def update(self, view):
                    raise MemoryError("no memory for the checksum")

                def intdigest(self):
                    return h.intdigest()
            return Broken()

        with mock.patch.object(checksum, "hasher", broken):
            with self.assertRaises(MemoryError):
                c1.send(torch.ones(20 << 20), 0)  # 80 MiB: hashed on a thread
        with self.assertRaises(muster.ChannelError) as told:
            c0.recv(1)
        self.assertIn("MemoryError: no memory for the checksum", str(told.exception))
        self.assertEqual(os.listdir(os.path.join(self.dir, "job", "0")), [],
                         "the temporary file is removed")

    def test_malformed_environment_names_the_variable(self):
        for bad, needle in (({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is invalid"),
                            ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is out of range"),
                            ({"WORLD_SIZE": "2"}, "RANK is not set"),
                            ({"RANK": "0", "WORLD_SIZE": "1", "MUSTER_ROUND": "-1"},
                             "MUSTER_ROUND='-1' is invalid")):
            with self.assertRaises(ValueError) as err:
                JobEnv.from_environ(bad)
            self.assertIn(needle, str(err.exception))

    def test_world_of_one_without_launch_uses_a_private_directory(self):
        with muster.Channel(env=JobEnv.from_environ({}), store=self.store) as c:
            private = c.round_dir
            t = c.broadcast(torch.arange(5), 0)
            self.assertTrue(os.path.isdir(private))
        self.assertTrue(torch.equal(t, torch.arange(5)))
        self.assertFalse(os.path.exists(private))

    def test_received_tensor_is_writable_private_and_outlives_its_file(self):
        c0, c1, c2 = self.channels(world=3)
        sent = torch.arange(100000, dtype=torch.float32)
        got = together(lambda: c0.broadcast(sent, 0), lambda: c1.broadcast(None, 0),
                       lambda: c2.broadcast(None, 0))
        self.assertEqual(os.listdir(os.path.join(self.dir, "job", "0")), [],
                         "the last receiver deleted the file")
        got[1].add_(1)  # in place, on rank 1's private mapping
        self.assertTrue(torch.equal(got[2], sent), "rank 2's copy is its own")
        self.assertTrue(torch.equal(got[1], sent + 1))
        self.assertTrue(got[1].is_contiguous())
        del c1
        self.assertEqual(got[1][-1].item(), 100000.0)

    def test_checksum_fallback_agrees_with_python3_xxhash(self):
        from muster import checksum
        data = bytes(range(256)) * 40000 + b"tail"
        results = {}
        for impl in ("xxhash", "libxxhash"):
            os.environ["MUSTER_CHECKSUM_IMPL"] = impl
            checksum._impl = None
            try:
                h = checksum.hasher()
                h.update(memoryview(data)[:12345])
                h.update(memoryview(data)[12345:])
                results[impl] = (checksum.xxh3_64(bytearray(data)), h.intdigest())
            finally:
                del os.environ["MUSTER_CHECKSUM_IMPL"]
                checksum._impl = None
        self.assertEqual(results["xxhash"], results["libxxhash"])
        self.assertEqual(results["xxhash"][0], results["xxhash"][1])


if __name__ == "__main__":
    unittest.main()
