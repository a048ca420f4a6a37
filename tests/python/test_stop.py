"""launch's coordinated stop, in real processes with real signals: ranks that ask
muster.stop_requested(step) (Python) or muster::worker::stopRequested(step) (C++, stop_tool) every
step, and a notice to launch while they run. What holds: every rank is told True at the same
step and False at every step before it; launch exits 75 and says "stopped at step S"; a rank
that never asks gets the notice as before and is named when the stop times out; before any rank
asked, a notice is what it always was.

MUSTER_BUILD_DIR names the build (launch, stop_tool); PYTHONPATH holds python/."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import ports  # noqa: E402  tests/support/ports.py: ports no test beside this one gets

# What every test of `import muster` under launch shares: the build's programs, the ranks'
# Python, and python_env() (PYTHONPATH with python/).
from test_under_launch import BUILD, HERE, LAUNCH, PY, RUN, python_env  # noqa: E402

TOOL = os.path.join(BUILD, "tests", "integration", "stop_tool")
RENDEZVOUSD = os.path.join(BUILD, "rendezvous", "rendezvousd")
SCRIPT = os.path.join(HERE, "stop_worker.py")
STOPPED = 75  # launch's exit code for a clean stop on request (docs/launching.md)


class Stop(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-stop-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def start(self, nproc, program, flags=("--master_port=0",), log="launch.log", env=None):
        """launch with `program` (after --no_python) for `nproc` ranks; its output to a file."""
        self.log = os.path.join(self.dir, log)
        out = open(self.log, "w")
        self.addCleanup(out.close)
        p = subprocess.Popen([LAUNCH, f"--nproc_per_node={nproc}", *flags,
                              "--no_python", *program], env=python_env(**(env or {})), stdout=out,
                             stderr=subprocess.STDOUT)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        return p

    def console(self, log=None):
        with open(log or self.log) as f:
            return f.read()

    def read(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def wait_running(self, p, ranks, at_least=1):
        """Waits until each of `ranks` wrote a step >= at_least; returns the largest step seen."""
        deadline = time.monotonic() + RUN
        while time.monotonic() < deadline:
            steps = [self.read(f"{r}.step") for r in ranks]
            if all(s is not None and int(s) >= at_least for s in steps):
                return max(int(s) for s in steps)
            self.assertIsNone(p.poll(), "launch ended before its ranks ran:\n" + self.console())
            time.sleep(0.05)
        self.fail("the ranks did not start:\n" + self.console())

    def finish(self, p):
        try:
            return p.wait(timeout=RUN)
        except subprocess.TimeoutExpired:
            p.kill()
            self.fail("launch did not end:\n" + self.console())

    def stops(self, ranks):
        """Each rank's (stop step, steps it was told False)."""
        got = {}
        for r in ranks:
            text = self.read(f"{r}.stop")
            self.assertIsNotNone(text, f"rank {r} was never told to stop:\n" + self.console())
            step, told_false = (int(x) for x in text.split())
            got[r] = (step, told_false)
        return got

    def assert_one_step(self, ranks, seen_before):
        got = self.stops(ranks)
        steps = {step for step, _ in got.values()}
        self.assertEqual(len(steps), 1, f"the ranks stopped at different steps: {got}")
        step = steps.pop()
        for r, (_, told_false) in got.items():
            self.assertEqual(told_false, step, f"rank {r} was told False {told_false} times before step {step}")
        self.assertGreater(step, seen_before, "a step a rank had passed before the notice")
        return step

    def test_four_python_ranks_of_a_gloo_ddp_loop_stop_at_one_step_on_sigusr1(self):
        p = self.start(4, [PY, SCRIPT, "ddp", self.dir])
        seen = self.wait_running(p, range(4), at_least=20)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        step = self.assert_one_step(range(4), seen)
        self.assertIn(f"launch: stopped at step {step} on request (SIGUSR1); 4 of 4 ranks stopped cleanly",
                      self.console())

    def test_cpp_and_python_ranks_at_thousands_of_steps_a_second_stop_at_one_step(self):
        # Ranks 0 and 2 C++, 1 and 3 Python, each at up to 5,000 steps a second.
        pick = (f'if [ $((RANK % 2)) = 0 ]; then exec {TOOL} {self.dir} 0.0002; '
                f'else exec {PY} {SCRIPT} slow {self.dir} 0.0002; fi')
        p = self.start(4, ["/bin/sh", "-c", pick])
        seen = self.wait_running(p, range(4), at_least=200)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        self.assert_one_step(range(4), seen)

    def test_a_slow_loop_stops_at_the_next_step_or_the_one_after(self):
        p = self.start(2, [PY, SCRIPT, "slow", self.dir, "0.3"])
        self.wait_running(p, range(2), at_least=2)
        # The furthest step a rank wrote, just before the notice (it writes a step after it was
        # told False and slept).
        seen = max(int(self.read(f"{r}.step")) for r in range(2))
        noticed = time.time()
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        step = self.assert_one_step(range(2), seen)
        # seen + 1 may have been told False before the notice, and its horizon seen + 2; a step
        # more for the notice's way on a loaded machine.
        self.assertLessEqual(step, seen + 4, "the stop came more than a few steps after the notice")
        last = max(os.path.getmtime(os.path.join(self.dir, f"{r}.stop")) for r in range(2))
        self.assertLess(last - noticed, 3 * 0.3 + 5, "the last rank stopped long after the notice")

    def test_a_rank_that_never_asks_is_named_when_the_stop_times_out(self):
        pick = (f'if [ "$RANK" = 2 ]; then exec {PY} {SCRIPT} never {self.dir}; '
                f'else exec {PY} {SCRIPT} slow {self.dir} 0.001; fi')
        p = self.start(3, ["/bin/sh", "-c", pick], flags=["--master_port=0", "--stop_timeout=3", "--grace_period=2"])
        seen = self.wait_running(p, range(3), at_least=0)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), 1, self.console())
        step = self.assert_one_step([0, 1], seen)
        # Not sent the notice: a rank that has not asked yet may be one still starting.
        self.assertIsNone(self.read("2.signal"), "the rank that never asked was sent the notice")
        console = self.console()
        self.assertIn(f"launch: the stop at step {step} on request (SIGUSR1) failed: not every rank stopped "
                      "within 3 s (--stop_timeout); 2 of 3 ranks stopped cleanly", console)
        self.assertRegex(console, r"rank 2 \(local_rank 2, pid \d+\) .*never asked stop_requested")

    def test_before_any_rank_asks_a_notice_is_passed_on_and_the_job_goes_on(self):
        p = self.start(2, [PY, SCRIPT, "never", self.dir])
        self.wait_running(p, range(2), at_least=0)
        p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + RUN
        while not all(self.read(f"{r}.signal") for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([self.read(f"{r}.signal") for r in range(2)], ["SIGUSR1", "SIGUSR1"])
        time.sleep(0.5)
        self.assertIsNone(p.poll(), "the job ended on a notice:\n" + self.console())
        p.send_signal(signal.SIGTERM)
        self.assertEqual(self.finish(p), 128 + signal.SIGTERM, self.console())
        self.assertNotIn("stopped at step", self.console())

    def test_a_second_notice_changes_nothing_and_sigterm_is_a_notice_when_asked_for(self):
        # The ranks stay 2 s after they stopped: the second notice comes while they run.
        p = self.start(2, [PY, SCRIPT, "slow", self.dir, "0.05"], flags=["--master_port=0", "--stop_notice=SIGUSR1,SIGTERM"],
                       env={"STOP_WORKER_LINGER": "2"})
        seen = self.wait_running(p, range(2), at_least=3)
        p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + RUN
        while "every rank stops at step" not in self.console() and time.monotonic() < deadline:
            time.sleep(0.01)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        step = self.assert_one_step(range(2), seen)
        console = self.console()
        self.assertIn(f"stopped at step {step} on request (SIGTERM); 2 of 2 ranks stopped cleanly", console)
        self.assertIn(f"launch got SIGUSR1 again: the ranks already stop at step {step}", console)

    def test_ranks_of_virtual_local_rank_each_have_their_own_slot(self):
        # LOCAL_RANK is 0 for every rank: the board's slot is MUSTER_STOP_SLOT.
        p = self.start(2, [PY, SCRIPT, "slow", self.dir, "0.002"], flags=["--master_port=0", "--virtual_local_rank"])
        seen = self.wait_running(p, range(2), at_least=20)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        self.assert_one_step(range(2), seen)

    def two_nodes(self, flags):
        """Two launches on this host with `flags` (and their node's own), 2 ranks each looping at
        up to 500 steps a second; SIGUSR1 to node 1 only: every rank of both stops at one step,
        the nodes agreeing through the job's store."""
        nodes = [self.start(2, [PY, SCRIPT, "slow", self.dir, "0.002"], flags=flags(n), log=f"node{n}.log")
                 for n in range(2)]
        logs = [os.path.join(self.dir, f"node{n}.log") for n in range(2)]
        seen = self.wait_running(nodes[1], range(4), at_least=50)
        nodes[1].send_signal(signal.SIGUSR1)
        for n, p in enumerate(nodes):
            self.log = logs[n]
            self.assertEqual(self.finish(p), STOPPED, f"node {n}:\n" + self.console())
        step = self.assert_one_step(range(4), seen)
        for n in range(2):
            self.assertIn(f"stopped at step {step} on request (SIGUSR1); 2 of 2 ranks stopped cleanly",
                          self.console(logs[n]))
        self.assertIn("asking every node to stop at one step", self.console(logs[1]))
        self.assertIn("the job is asked to stop (SIGUSR1 to a node's launch)", self.console(logs[0]))

    def test_two_nodes_stop_at_one_step_when_only_node_1_gets_the_notice(self):
        # node 0's launch hosts the rendezvous (launch's own service)
        port = ports.reserve_port()
        self.two_nodes(lambda n: ["--nnodes=2", f"--node_rank={n}", "--master_addr=127.0.0.1",
                                  f"--master_port={port}"])

    def test_two_nodes_on_rendezvousd_stop_at_one_step(self):
        port = ports.reserve_port()
        d = subprocess.Popen([RENDEZVOUSD, "--host=127.0.0.1", f"--port={port}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (d.terminate(), d.wait()))
        self.wait_port(port)
        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                                  "--rdzv_id=stopjob", "--rdzv_conf=is_host=false"])

    def test_two_nodes_on_etcd_stop_at_one_step(self):
        client, peer = ports.reserve_port(), ports.reserve_port()
        etcd = subprocess.Popen(
            ["/usr/bin/etcd", "--name=stop", f"--data-dir={self.dir}/etcd",
             f"--listen-client-urls=http://127.0.0.1:{client}", f"--advertise-client-urls=http://127.0.0.1:{client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=stop=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (etcd.terminate(), etcd.wait()))
        self.wait_port(client)
        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=etcd", f"--rdzv_endpoint=127.0.0.1:{client}",
                                  "--rdzv_id=stopjob"])

    def wait_port(self, port):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        self.fail(f"nothing listens on port {port}")

class StopRequestedAlone(unittest.TestCase):
    """muster.stop_requested against a board made here (common/stop_board.h's layout)."""

    def test_a_fast_loop_is_promised_more_than_one_step_at_a_time_and_a_slow_one_one(self):
        import struct
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
        from muster import stop
        d = tempfile.mkdtemp(prefix="muster-stopreq-")
        self.addCleanup(shutil.rmtree, d, True)
        board = os.path.join(d, "board")
        with open(board, "wb") as f:
            f.write(b"MSTOPBD1" + struct.pack("<7q", 1, 0, 0, -1, 0, 0, 0) + struct.pack("<q", -1))
        saved = {k: os.environ.get(k) for k in ("MUSTER_STOP_FILE", "MUSTER_STOP_SLOT")}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                 for k, v in saved.items()])
        os.environ.update(MUSTER_STOP_FILE=board, MUSTER_STOP_SLOT="0")
        stop._asker = stop._Asker()

        def horizon():
            with open(board, "rb") as f:
                return struct.unpack("<q", f.read()[24:32])[0]
        step = 0
        for step in range(5):  # a step every 3 ms: one step at a time
            self.assertFalse(stop.stop_requested(step))
            time.sleep(0.003)
        self.assertEqual(horizon(), 5)
        lead, step, until = 0, 5, time.monotonic() + 0.05
        i = 0
        while time.monotonic() < until:
            self.assertFalse(stop.stop_requested(step))
            if i % 64 == 0:
                lead = max(lead, horizon() - step)
            step, i = step + 1, i + 1
        self.assertGreater(lead, 2, "a fast loop locks the board at every step")
        self.assertLessEqual(lead, 256)


if __name__ == "__main__":
    unittest.main()
