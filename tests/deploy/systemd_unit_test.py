#!/usr/bin/python3
"""deploy/systemd/rendezvousd.service: systemd's own checks (verify; the offline security
score stays "OK"), and its ExecStart run as systemd would run it (the credential directory
holding the token, RENDEZVOUSD_ARGS empty) answers health checks and refuses a client without
the token.

    systemd_unit_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import reserve_port  # noqa: E402  (a port no test beside this one gets)

BUILD, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
UNIT = os.path.join(SOURCE, "deploy", "systemd", "rendezvousd.service")
DAEMON = os.path.join(BUILD, "rendezvous", "rendezvousd")
CTL = os.path.join(BUILD, "rendezvous", "rendezvousctl")


def service_section():
    # systemd allows a key more than once (SystemCallFilter=): every value, in order.
    with open(UNIT) as f:
        text = f.read()
    values = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        values.setdefault(section, {}).setdefault(key, []).append(value)
    return values


class Unit(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="muster-systemd-")
        self.unit = os.path.join(self.work, "rendezvousd.service")
        with open(UNIT) as f:
            text = f.read()
        # The installed path, pointed at this build.
        self.assertIn("/usr/local/bin/rendezvousd", text)
        with open(self.unit, "w") as f:
            f.write(text.replace("/usr/local/bin/rendezvousd", DAEMON))
        self.sections = service_section()

    def tearDown(self):
        shutil.rmtree(self.work, ignore_errors=True)

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze is not installed")
    def test_systemd_verifies_it_and_scores_it_ok(self):
        verify = subprocess.run(["systemd-analyze", "verify", self.unit], capture_output=True, text=True)
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertEqual(verify.stderr.strip(), "", verify.stderr)
        # Exposure 0.0 (locked down) to 10.0 (unsafe); under 2.0 reads "OK".
        sec = subprocess.run(["systemd-analyze", "security", "--offline=true", "--threshold=20", self.unit],
                             capture_output=True, text=True)
        self.assertEqual(sec.returncode, 0, sec.stdout + sec.stderr)
        level = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", sec.stdout)
        self.assertIsNotNone(level, sec.stdout)
        self.assertLess(float(level.group(1)), 2.0, level.group(0))

    def test_hardening_is_there(self):
        service = self.sections["Service"]
        for key, value in {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                           "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
                           "Restart": "on-failure"}.items():
            self.assertEqual(service[key][-1], value, key)
        self.assertEqual(service["LoadCredential"], ["token:/etc/muster/token"])
        self.assertIn("multi-user.target", self.sections["Install"]["WantedBy"])

    def test_exec_start_runs(self):
        service = self.sections["Service"]
        (exec_start,) = service["ExecStart"]
        creds = os.path.join(self.work, "credentials")
        os.makedirs(creds)
        with open(os.path.join(creds, "token"), "w") as f:
            f.write("s3cret\n")
        port = reserve_port()
        # systemd's expansion: ${VAR} one word, $VAR split on whitespace (empty: nothing).
        line = exec_start.replace("${CREDENTIALS_DIRECTORY}", creds).replace("$RENDEZVOUSD_ARGS", "")
        argv = shlex.split(line)
        self.assertEqual(argv[0], "/usr/local/bin/rendezvousd")
        argv[0] = DAEMON
        self.assertIn("--port=29400", argv)
        argv[argv.index("--port=29400")] = f"--port={port}"
        daemon = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            health = subprocess.run([CTL, f"--addr=127.0.0.1:{port}", "--timeout=10", "health"],
                                    capture_output=True, text=True, timeout=30)
            self.assertEqual(health.returncode, 0, health.stderr)
            self.assertEqual(health.stdout.strip(), "SERVING")
            refused = subprocess.run([CTL, f"--addr=127.0.0.1:{port}", "--timeout=5", "set", "k", "v"],
                                     capture_output=True, text=True, timeout=30)
            self.assertNotEqual(refused.returncode, 0)
            token = os.path.join(creds, "token")
            ok = subprocess.run([CTL, f"--addr=127.0.0.1:{port}", f"--token-file={token}", "--timeout=5",
                                 "add", "k", "2"], capture_output=True, text=True, timeout=30)
            self.assertEqual((ok.returncode, ok.stdout.strip()), (0, "2"), ok.stderr)
        finally:
            # KillSignal=SIGTERM: a clean exit within TimeoutStopSec.
            daemon.terminate()
            out, _ = daemon.communicate(timeout=15)
        self.assertEqual(daemon.returncode, 0, out)
        self.assertEqual(service["KillSignal"], ["SIGTERM"])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
