"""launch's coordinated stop, in real processes with real signals: ranks that ask
muster.stop_requested(step) (Python) or muster::worker::stopRequested(step) (C++, stop_tool) every
step, and a notice to launch while they run. What holds: every rank is told True at the same
step and False at every step before it; launch exits 75 and says "stopped at step S"; a rank
that never asks gets the notice as before and is named when the stop times out; before any rank
asked, a notice is what it always was.

MUSTER_BUILD_DIR names the build (launch, stop_tool); PYTHONPATH holds python/."""

import json
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
RENDEZVOUSCTL = os.path.join(BUILD, "rendezvous", "rendezvousctl")
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

    def test_stop_at_a_time_stops_every_rank_at_one_step_when_it_comes(self):
        at = int(time.time()) + 3
        p = self.start(2, [PY, SCRIPT, "slow", self.dir, "0.002"], flags=["--master_port=0", f"--stop_at={at}"])
        self.assertEqual(self.finish(p), STOPPED, self.console())
        step = self.assert_one_step(range(2), 0)
        for r in range(2):  # told at the time given, not before
            self.assertGreaterEqual(os.stat(os.path.join(self.dir, f"{r}.stop")).st_mtime, at)
        console = self.console()
        self.assertIn(f"the job is asked to stop at {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(at))} "
                      "(the time given) (--stop_at)", console)
        self.assertIn(f"stopped at step {step} on request (--stop_at); 2 of 2 ranks stopped cleanly", console)

    def test_stop_at_a_time_past_waits_for_the_first_rank_to_ask(self):
        p = self.start(2, [PY, SCRIPT, "slow", self.dir, "0.002"], flags=["--master_port=0", "--stop_at=1"])
        self.assertEqual(self.finish(p), STOPPED, self.console())
        self.assert_one_step(range(2), -1)
        self.assertIn("--stop_at's time came, but no rank of the job asks stop_requested yet: asking again each "
                      "second", self.console())

    def test_the_next_start_resumes_from_the_step_kept_and_a_success_forgets_it(self):
        record = os.path.join(self.dir, "kept", "stopped.json")
        os.makedirs(os.path.dirname(record))
        flags = ["--master_port=0", f"--stop_record={record}"]
        p = self.start(2, [PY, SCRIPT, "resume", self.dir, "0.002"], flags=flags, log="first.log")
        seen = self.wait_running(p, range(2), at_least=20)
        self.assertEqual(self.read("0.resumed"), "none")
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        step = self.assert_one_step(range(2), seen)
        with open(record) as f:
            kept = json.load(f)
        self.assertEqual((kept["step"], kept["reason"]), (step, "SIGUSR1"), kept)
        self.assertIn(f"the stop step {step} is kept in {record}", self.console())
        # The next start: every rank is told where the job stopped, runs on and succeeds.
        p = self.start(2, [PY, SCRIPT, "resume", self.dir, "0.002"], flags=flags, log="second.log")
        self.assertEqual(self.finish(p), 0, self.console())
        for r in range(2):
            self.assertEqual(self.read(f"{r}.resumed"), str(step))
        self.assertIn(f"resumes: it stopped at step {step} on request (SIGUSR1)", self.console())
        self.assertFalse(os.path.exists(record), "a success leaves the stop record behind")

    def test_a_stop_record_launch_does_not_write_is_one_line_and_the_job_starts_afresh(self):
        record = os.path.join(self.dir, "stopped.json")
        for text in ('{"run_id": "x", "step": -4, "reason": "r", "unix_ms": 0}', '{"step": 12', "\x00\xff"):
            with open(record, "w", encoding="latin-1") as f:
                f.write(text)
            p = self.start(1, [PY, SCRIPT, "resume", self.dir, "0.002"], log="foreign.log",
                           flags=["--master_port=0", f"--stop_record={record}", "--stop_at=1"])
            self.assertEqual(self.finish(p), STOPPED, self.console())
            self.assertEqual(self.read("0.resumed"), "none")
            lines = [l for l in self.console().splitlines() if "not a stop record launch writes" in l]
            self.assertEqual(len(lines), 1, self.console())
            self.assertIn(record, lines[0])

    def test_ranks_that_end_on_their_own_before_the_stop_step_make_a_success(self):
        # The ranks were promised every step to their last (300) before the notice: the stop step
        # is past it, and they end their loop. No stop happened: exit 0, nothing kept.
        record = os.path.join(self.dir, "stopped.json")
        p = self.start(2, [PY, SCRIPT, "ends", self.dir, "0.002"], flags=["--master_port=0", f"--stop_record={record}"])
        self.wait_running(p, range(2), at_least=20)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), 0, self.console())
        self.assertIn("the ranks ended on their own before the stop step", self.console())
        self.assertNotIn("stopped at step", self.console())
        self.assertFalse(os.path.exists(record))
        self.assertIsNone(self.read("0.stop"))

    def test_a_notice_during_a_failure_with_no_restart_left_keeps_its_usual_meaning(self):
        p = self.start(2, [PY, SCRIPT, "restart", self.dir, "0.002"], flags=["--master_port=0", "--max_restarts=0"])
        self.wait_file(p, "1.term")
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), 1, self.console())
        console = self.console()
        self.assertNotIn("while the group restarts", console)
        self.assertIn("launch got SIGUSR1; forwarding it to the workers", console)
        self.assertIn("rank 0", console)

    def test_ranks_of_virtual_local_rank_each_have_their_own_slot(self):
        # LOCAL_RANK is 0 for every rank: the board's slot is MUSTER_STOP_SLOT.
        p = self.start(2, [PY, SCRIPT, "slow", self.dir, "0.002"], flags=["--master_port=0", "--virtual_local_rank"])
        seen = self.wait_running(p, range(2), at_least=20)
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        self.assert_one_step(range(2), seen)

    def wait_file(self, p, name):
        deadline = time.monotonic() + RUN
        while self.read(name) is None:
            self.assertLess(time.monotonic(), deadline, f"no {name}:\n" + self.console())
            self.assertIsNone(p.poll(), "launch ended:\n" + self.console())
            time.sleep(0.02)

    def assert_resumed_at_one_step(self, ranks):
        """After a notice kept over a restart: the ranks of the new round (which start at step
        1000) all stopped at one step, each told False at every step before it; the step."""
        got = self.stops(ranks)
        steps = {step for step, _ in got.values()}
        self.assertEqual(len(steps), 1, f"the ranks stopped at different steps: {got}")
        step = steps.pop()
        self.assertGreaterEqual(step, 1000, got)
        for r, (_, told_false) in got.items():
            self.assertEqual(told_false, step - 1000, f"rank {r}: {got}")
        return step

    def test_a_notice_while_the_group_restarts_stops_the_next_round_at_its_first_step(self):
        # Rank 0 fails in the first round; rank 1 takes 1.5 s to go on SIGTERM: the notice comes
        # while the group stops for the restart, and the new round's ranks stop at their first step.
        p = self.start(2, [PY, SCRIPT, "restart", self.dir, "0.002"], flags=["--master_port=0", "--max_restarts=1"])
        self.wait_file(p, "1.term")
        p.send_signal(signal.SIGUSR1)
        self.assertEqual(self.finish(p), STOPPED, self.console())
        self.assertEqual(self.assert_resumed_at_one_step(range(2)), 1000)
        console = self.console()
        self.assertIn("launch got SIGUSR1 while the group restarts", console)
        self.assertIn("stopped at step 1000 (the round's first) on request (SIGUSR1); 2 of 2 ranks stopped cleanly",
                      console)

    def test_a_notice_to_node_1_while_both_nodes_restart_stops_every_rank_at_one_step(self):
        port = ports.reserve_port()
        logs = [os.path.join(self.dir, f"node{n}.log") for n in range(2)]
        nodes = [self.start(2, [PY, SCRIPT, "restart", self.dir, "0.002"], log=f"node{n}.log",
                            flags=["--nnodes=2", f"--node_rank={n}", "--master_addr=127.0.0.1",
                                   f"--master_port={port}", "--max_restarts=1"]) for n in range(2)]
        self.log = logs[1]
        self.wait_file(nodes[1], "3.term")  # node 1 stops its ranks for node 0's failure
        nodes[1].send_signal(signal.SIGUSR1)
        for n, p in enumerate(nodes):
            self.log = logs[n]
            self.assertEqual(self.finish(p), STOPPED, f"node {n}:\n" + self.console())
        step = self.assert_resumed_at_one_step(range(4))
        self.assertIn("launch got SIGUSR1 while the group restarts", self.console(logs[1]))
        self.assertIn("the job is asked to stop (SIGUSR1 to a node's launch)", self.console(logs[0]))
        for n in range(2):
            self.assertRegex(self.console(logs[n]), rf"stopped at step {step}( \(the round's first\))? on request "
                             r"\(SIGUSR1\); 2 of 2 ranks stopped cleanly")

    def two_nodes(self, flags, notice=None, env=None, per_step="0.002"):
        """Two launches on this host with `flags` (and their node's own), 2 ranks each looping at
        up to 500 steps a second (per_step); SIGUSR1 to node 1 only (or `notice(nodes)`, which returns the
        reason's name): every rank of both stops at one step, the nodes agreeing through the
        job's store."""
        nodes = [self.start(2, [PY, SCRIPT, "slow", self.dir, per_step], flags=flags(n), log=f"node{n}.log", env=env)
                 for n in range(2)]
        logs = [os.path.join(self.dir, f"node{n}.log") for n in range(2)]
        seen = self.wait_running(nodes[1], range(4), at_least=50)
        if notice:
            why = notice(nodes)
            said = "the job is asked to stop ({})".format(why + " to a node's launch" if why.startswith("SIG") else why)
        else:
            nodes[1].send_signal(signal.SIGUSR1)
            why, said = "SIGUSR1", "the job is asked to stop (SIGUSR1 to a node's launch)"
        for n, p in enumerate(nodes):
            self.log = logs[n]
            self.assertEqual(self.finish(p), STOPPED, f"node {n}:\n" + self.console())
        step = self.assert_one_step(range(4), seen)
        for n in range(2):
            self.assertIn(f"stopped at step {step} on request ({why}); 2 of 2 ranks stopped cleanly",
                          self.console(logs[n]))
        if notice:
            for n in range(2):
                self.assertIn(said, self.console(logs[n]))
        else:
            self.assertIn("asking every node to stop at one step", self.console(logs[1]))
            self.assertIn(said, self.console(logs[0]))
        return step

    def test_two_nodes_stop_at_one_step_when_only_node_1_gets_the_notice(self):
        # node 0's launch hosts the rendezvous (launch's own service)
        port = ports.reserve_port()
        self.two_nodes(lambda n: ["--nnodes=2", f"--node_rank={n}", "--master_addr=127.0.0.1",
                                  f"--master_port={port}"])

    def rendezvousd(self, *flags):
        """A rendezvousd of this test's own (killed at the end, frozen or not); it and its port."""
        port = ports.reserve_port()
        d = subprocess.Popen([RENDEZVOUSD, "--host=127.0.0.1", f"--port={port}", *flags], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (d.kill(), d.wait()))
        self.wait_port(port)
        return d, port

    def test_two_nodes_on_rendezvousd_stop_at_one_step(self):
        _, port = self.rendezvousd()
        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                                  "--rdzv_id=stopjob", "--rdzv_conf=is_host=false"])

    def stalled(self, frozen, seconds=2.0):
        """A notice to node 1 while `frozen` (a process) is stopped for `seconds` (SIGSTOP,
        SIGCONT): the stop is agreed once it answers again."""
        def notice(nodes):
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                nodes[1].send_signal(signal.SIGUSR1)
                time.sleep(seconds)
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            return "SIGUSR1"
        return notice

    def test_a_rendezvousd_frozen_for_2_s_at_1000_steps_a_second_still_gives_one_stop_step(self):
        d, port = self.rendezvousd()
        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                                  "--rdzv_id=stalljob", "--rdzv_conf=is_host=false"],
                       notice=self.stalled(d), per_step="0.001")

    def test_node_0s_launch_frozen_for_2_s_as_the_rendezvous_still_gives_one_stop_step(self):
        # launch's own service: node 0's launch holds the store. Its ranks run on while it is
        # stopped (they move its board's horizon), and it freezes a later one when it wakes.
        port = ports.reserve_port()
        self.two_nodes(lambda n: ["--nnodes=2", f"--node_rank={n}", "--master_addr=127.0.0.1",
                                  f"--master_port={port}"],
                       notice=lambda nodes: self.stalled(nodes[0])(nodes), per_step="0.001")

    def rendezvousctl(self, *args):
        return subprocess.run([RENDEZVOUSCTL, *args], capture_output=True, text=True, timeout=RUN)

    def test_rendezvousctl_stop_stops_two_nodes_at_one_step_and_a_wrong_token_is_refused(self):
        token, wrong = os.path.join(self.dir, "token"), os.path.join(self.dir, "wrong")
        for path, text in ((token, "stop-me"), (wrong, "not-it")):
            with open(path, "w") as f:
                f.write(text + "\n")
        _, port = self.rendezvousd(f"--token-file={token}")
        addr = f"127.0.0.1:{port}"

        def notice(nodes):
            refused = self.rendezvousctl("--addr", addr, "--token-file", wrong, "--timeout", "10", "stop",
                                         "--run", "stopjob")
            self.assertEqual(refused.returncode, 1, refused.stdout + refused.stderr)
            self.assertEqual(len(refused.stderr.splitlines()), 1, refused.stderr)
            self.assertIn("cannot ask run 'stopjob'", refused.stderr)
            self.assertIn("token", refused.stderr.lower())
            # Refused: the job runs on, no rank is told to stop.
            before = self.wait_running(nodes[1], range(4), at_least=0)
            self.wait_running(nodes[1], range(4), at_least=before + 20)
            self.assertFalse(any(self.read(f"{r}.stop") for r in range(4)))
            asked = self.rendezvousctl("--addr", addr, "--token-file", token, "--timeout", "10", "stop",
                                       "--run", "stopjob")
            self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
            self.assertIn("asked run 'stopjob' (round ", asked.stdout)
            # The ranks linger after their stop (STOP_WORKER_LINGER): the run's status says it.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                shown = self.rendezvousctl("--addr", addr, "--token-file", token, "status", "--run", "stopjob")
                if "every rank stops at step" in shown.stdout or "finished" in shown.stdout:
                    break
                time.sleep(0.1)
            self.assertRegex(shown.stdout, r"stopping on request \(rendezvousctl stop\): every rank stops at step \d+",
                             shown.stdout + shown.stderr)
            return "rendezvousctl stop"

        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint={addr}",
                                  "--rdzv_id=stopjob", "--rdzv_conf=is_host=false"],
                       notice=notice, env={"MUSTER_STORE_TOKEN_FILE": token, "STOP_WORKER_LINGER": "3"})
        again = self.rendezvousctl("--addr", addr, "--token-file", token, "--timeout", "5", "stop", "--run", "stopjob")
        self.assertEqual(again.returncode, 1, again.stdout + again.stderr)
        self.assertIn("not running a round", again.stderr)

    def etcd(self):
        """A one-member etcd of this test's own; its client port."""
        client, peer = ports.reserve_port(), ports.reserve_port()
        etcd = subprocess.Popen(
            ["/usr/bin/etcd", "--name=stop", f"--data-dir={self.dir}/etcd",
             f"--listen-client-urls=http://127.0.0.1:{client}", f"--advertise-client-urls=http://127.0.0.1:{client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=stop=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (etcd.kill(), etcd.wait()))
        self.wait_port(client)
        self.etcd_process = etcd
        return client

    def test_an_etcd_frozen_for_2_s_at_1000_steps_a_second_still_gives_one_stop_step(self):
        client = self.etcd()
        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=etcd", f"--rdzv_endpoint=127.0.0.1:{client}",
                                  "--rdzv_id=stalljob"], notice=self.stalled(self.etcd_process), per_step="0.001")

    def test_two_nodes_on_etcd_stop_at_one_step(self):
        client = self.etcd()
        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=etcd", f"--rdzv_endpoint=127.0.0.1:{client}",
                                  "--rdzv_id=stopjob"])

    def test_rendezvousctl_stop_reaches_a_run_on_etcd_through_node_0s_store(self):
        client = self.etcd()
        token = os.path.join(self.dir, "token")
        with open(token, "w") as f:
            f.write("stop-me\n")

        def notice(nodes):
            asked = self.rendezvousctl("--etcd", f"127.0.0.1:{client}", "--token-file", token, "--timeout", "10",
                                       "stop", "--run", "stopjob")
            self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
            return "rendezvousctl stop"

        self.two_nodes(lambda n: ["--nnodes=2", "--rdzv_backend=etcd", f"--rdzv_endpoint=127.0.0.1:{client}",
                                  "--rdzv_id=stopjob"], notice=notice, env={"MUSTER_STORE_TOKEN_FILE": token})

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

    def test_resumed_from_step_is_the_step_launch_gave_or_none(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
        import muster
        saved = os.environ.pop("MUSTER_RESUMED_FROM_STEP", None)
        self.addCleanup(lambda: saved is not None and os.environ.__setitem__("MUSTER_RESUMED_FROM_STEP", saved))
        self.addCleanup(os.environ.pop, "MUSTER_RESUMED_FROM_STEP", None)
        self.assertIsNone(muster.resumed_from_step())
        os.environ["MUSTER_RESUMED_FROM_STEP"] = str(2**62)
        self.assertEqual(muster.resumed_from_step(), 2**62)
        for bad in ("", "-1", "12x", " 3", "٣", str(2**63)):
            os.environ["MUSTER_RESUMED_FROM_STEP"] = bad
            with self.assertRaisesRegex(ValueError, "MUSTER_RESUMED_FROM_STEP=.* is not a step"):
                muster.resumed_from_step()


if __name__ == "__main__":
    unittest.main()
