"""`import muster` in real Python processes under launch (Debian's python3 and torch 1.13, or
under tests/compat/with_torch.sh a Debian root's torch 2.6 or 2.14 on Python 3.13 or 3.14):
every operation on 2 and 4 ranks, C++ and Python ranks of one job both ways, 1 GiB, a sender
killed mid-write, a directory that is not shared, progress() against --hang_timeout, the
job's store across rounds, and the decoding example on 1, 2 and 4 ranks.

MUSTER_BUILD_DIR names the build (launch, channel_tool, worker); PYTHONPATH holds python/."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("MUSTER_BUILD_DIR", os.path.join(SOURCE, "build"))
LAUNCH = os.path.join(BUILD, "launcher", "launch")
TOOL = os.path.join(BUILD, "tests", "integration", "channel_tool")
WORKER = os.path.join(BUILD, "worker", "worker")
# The ranks' Python: the host's, or under tests/compat/with_torch.sh a Debian root's (torch 2.6 on
# Python 3.13, 2.14 on 3.14).
PY = os.environ.get("MUSTER_TEST_PYTHON", "/usr/bin/python3")
SCRIPT = os.path.join(HERE, "channel_worker.py")
RUN = 300  # seconds a job may take on a loaded 2-core machine


def python_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SOURCE, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


def launch(args, timeout=RUN, **env):
    return subprocess.run([LAUNCH, "--master_port=0", *args], env=python_env(**env),
                          capture_output=True, text=True, timeout=timeout)


class UnderLaunch(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-pylaunch-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def ok(self, run):
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        return run.stdout

    def files_left(self):
        return [os.path.join(d, f) for d, _, fs in os.walk(self.dir) for f in fs]

    def test_every_operation_on_2_and_4_ranks_and_nothing_left_afterwards(self):
        for n in (2, 4):
            out = self.ok(launch([f"--nproc_per_node={n}", "--shared_dir", self.dir,
                                  "--no_python", PY, SCRIPT, "all", "shapes", "bytes",
                                  "inplace", "store"]))
            for r in range(n):
                for mode in ("all", "shapes", "bytes", "inplace", "store"):
                    self.assertIn(f"channel_worker rank {r}: {mode} ok", out)
            self.assertEqual(self.files_left(), [])
            self.assertEqual(os.listdir(self.dir), [], "the job's folder goes with the job")

    def test_cpp_and_python_ranks_exchange_both_ways(self):
        # Even ranks C++ and odd ones Python, then the other way round: every operation, every
        # dtype, in both directions, the collectives rooted on either kind.
        for n, python_parity in ((2, 1), (4, 1), (4, 0)):
            pick = (f'if [ $((RANK % 2)) = {python_parity} ]; then exec {PY} {SCRIPT} all; '
                    f'else exec {TOOL} all; fi')
            out = self.ok(launch([f"--nproc_per_node={n}", "--shared_dir", self.dir,
                                  "--no_python", "/bin/sh", "-c", pick]))
            for r in range(n):
                if r % 2 == python_parity:
                    self.assertIn(f"channel_worker rank {r}: all ok", out)
                else:
                    self.assertIn(f"channel_tool rank {r}: every operation ok", out)
            self.assertEqual(self.files_left(), [])

    def test_a_large_tensor_crosses_between_cpp_and_python_both_ways(self):
        # 256 MiB: streamed by a Python sender (the C++ receiver waits for the whole file).
        for python_rank in (0, 1):
            pick = (f'if [ "$RANK" = {python_rank} ]; then exec {PY} {SCRIPT} big 256; '
                    f'else exec {TOOL} big 256; fi')
            out = self.ok(launch(["--nproc_per_node=2", "--shared_dir", self.dir,
                                  "--no_python", "/bin/sh", "-c", pick]))
            received = "channel_worker rank 1" if python_rank == 1 else "channel_tool rank 1"
            self.assertIn(f"{received}: received 256 MiB intact", out)
            self.assertEqual(self.files_left(), [])

    def test_one_gibibyte_arrives_intact(self):
        out = self.ok(launch(["--nproc_per_node=2", "--shared_dir", self.dir, "--no_python",
                              PY, SCRIPT, "big", "1024"]))
        self.assertIn("channel_worker rank 1: received 1024 MiB intact", out)

    def test_directory_not_shared_is_caught_at_start_on_every_rank(self):
        # Each rank its own folder, as a --shared_dir local to each node would be.
        per_rank = ('mkdir -p "$MUSTER_SHARED_DIR/node$RANK" && '
                    f'MUSTER_SHARED_DIR="$MUSTER_SHARED_DIR/node$RANK" exec {PY} {SCRIPT} all')
        run = launch(["--nproc_per_node=2", "--shared_dir", self.dir, "--no_python",
                      "/bin/sh", "-c", per_rank], MUSTER_TEST_TIMEOUT="20")
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("is not shared by every rank: rank 1 cannot see", run.stderr)
        self.assertIn("ChannelNotShared", run.stderr)

    def test_sender_killed_mid_write_is_a_clear_error_and_no_partial_file_is_read(self):
        # The store stands in for launch's (a TCPStore master here), so that the receiver
        # outlives the sender and says what it saw. The receiver starts once the sender is
        # dead, finds the transfer begun (streamed: 1 GiB on one node), follows the file and
        # waits for the rest.
        # The ranks' own torch serves it: a torch 2.x client does not speak to 1.13's server.
        master = subprocess.Popen(
            [PY, "-c", "import datetime, sys, torch.distributed as d\n"
             "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=120), False)\n"
             "print(s.port, flush=True)\nsys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=python_env())
        self.addCleanup(master.communicate, timeout=RUN)
        port = int(master.stdout.readline())
        common = dict(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      MUSTER_SHARED_DIR=self.dir, MUSTER_JOB_ID="k", MUSTER_ROUND="0")
        rank = lambda r, *mode, **more: subprocess.Popen(
            [PY, SCRIPT, *mode], env=python_env(RANK=str(r), LOCAL_RANK=str(r), **common,
                                                **more),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The start-up probe needs both ranks: a stand-in for rank 0 passes it, then waits.
        probe = rank(0, "recv", MUSTER_TEST_TIMEOUT="600")
        sender = rank(1, "send", "1024")
        round_dir = os.path.join(self.dir, "k", "0")
        # Killed once its first 64 MiB segment is written: mid-stream, 1 GiB taking far
        # longer to write than the kill takes to land.
        def written():
            try:
                return max(os.path.getsize(os.path.join(round_dir, n))
                           for n in os.listdir(round_dir)
                           if n.startswith(".p2p.1.0.0.0.") and n.endswith(".tmp"))
            except (OSError, ValueError):  # not there yet
                return 0
        deadline = time.monotonic() + RUN
        while time.monotonic() < deadline and written() <= 64 << 20:
            time.sleep(0.05)
        sender.send_signal(signal.SIGKILL)
        _, sender_err = sender.communicate(timeout=RUN)
        probe.kill()
        probe.communicate(timeout=RUN)
        self.assertEqual(sender.returncode, -signal.SIGKILL, sender_err)
        self.assertTrue(any(n.startswith(".p2p.1.0.0.0.") and n.endswith(".tmp")
                            for n in os.listdir(round_dir)), "the sender was not mid-write")
        receiver = rank(0, "recv", MUSTER_TEST_TIMEOUT="5")  # the probe keys are there
        _, err = receiver.communicate(timeout=RUN)
        self.assertEqual(receiver.returncode, 1, err)
        self.assertIn("rank 1 did not announce", err)
        self.assertIn("p2p.1.0.0.0.mt", err)
        self.assertIn("ChannelTimeout", err)
        self.assertFalse(os.path.exists(os.path.join(round_dir, "p2p.1.0.0.0.mt")),
                         "a half-written file was put in place")

    def test_progress_counts_against_the_hang_timeout(self):
        # 10 s of progress() and no output with --hang_timeout=6: no hang while it lasts (had
        # progress not counted, the hang would be declared 6 s after the start), then one.
        start = time.monotonic()
        run = launch(["--nproc_per_node=2", "--hang_timeout=6", "--stacks_timeout=2",
                      "--no_python", PY, SCRIPT, "progress", "10"])
        elapsed = time.monotonic() - start
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("no rank showed progress for 6 s (--hang_timeout)", run.stderr)
        self.assertGreater(elapsed, 10, run.stderr)

    def test_the_store_is_the_rounds_own_after_a_restart(self):
        script = os.path.join(self.dir, "rounds.py")
        with open(script, "w") as f:
            f.write(
                "import datetime, os, sys, muster\n"
                "s = muster.store()\n"
                "r = os.environ['MUSTER_ROUND']\n"
                "if r == '0':\n"
                "    s.set('left/' + os.environ['RANK'], b'round 0')\n"
                "    s.wait(['left/0', 'left/1'])\n"
                "    sys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
                "try:\n"
                "    s.wait(['left/0'], datetime.timedelta(seconds=1))\n"
                "    print(f'round {r} sees a key of round 0', flush=True); sys.exit(1)\n"
                "except RuntimeError as e:\n"
                "    if 'imeout' not in str(e): raise\n"
                "    print(f'round {r} starts clean', flush=True)\n")
        out = self.ok(launch(["--nproc_per_node=2", "--max_restarts=1", "--no_python", PY,
                              script]))
        self.assertEqual(out.count("round 1 starts clean"), 2, out)


class DecodeExample(unittest.TestCase):
    def test_the_same_predictions_on_1_2_and_4_ranks_and_without_launch(self):
        work = tempfile.mkdtemp(prefix="muster-pydecode-")
        self.addCleanup(shutil.rmtree, work, True)
        subprocess.run([WORKER, "gen-data", "--out", work, "--train", "2000", "--dev", "10",
                        "--test", "300"], check=True, capture_output=True, timeout=RUN)
        example = os.path.join(SOURCE, "examples", "decode.py")
        args = ["--train", os.path.join(work, "train.tsv"), "--input",
                os.path.join(work, "test.tsv")]
        outputs = []
        for n in (1, 2, 4):
            out = os.path.join(work, f"pred{n}.tsv")
            run = launch([f"--nproc_per_node={n}", example, *args, "--output", out],
                         PYTHON_EXEC=PY)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn(f"300 sentences on {n} rank(s)", run.stdout)
            outputs.append(open(out).read())
        alone = os.path.join(work, "alone.tsv")
        run = subprocess.run([PY, example, *args, "--output", alone], env=python_env(),
                             capture_output=True, text=True, timeout=RUN)
        self.assertEqual(run.returncode, 0, run.stderr)
        outputs.append(open(alone).read())
        self.assertEqual(len(outputs[0].splitlines()), 301)
        for other in outputs[1:]:
            self.assertEqual(other, outputs[0])
        accuracy = float(run.stdout.split("accuracy ")[1].split(";")[0])
        self.assertGreater(accuracy, 0.8, "the fitted model predicts the generated labels")


if __name__ == "__main__":
    unittest.main()
