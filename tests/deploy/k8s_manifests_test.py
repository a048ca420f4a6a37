#!/usr/bin/python3
"""deploy/k8s: parse the manifests, check the fields that tie them to muster's flags, then run
what they describe on this machine: rendezvousd with the Deployment's arguments (its health
checked as the probes do, without the token), and the Job's two pods as two launch processes
with the environment and arguments Kubernetes would give them (fieldRefs resolved, $(VAR)
expanded), joined through that rendezvousd with the Secret's token.

    k8s_manifests_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import reserve_port as free_port  # noqa: E402  (a port no test beside this one gets)

BUILD, SOURCE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
K8S = os.path.join(SOURCE, "deploy", "k8s")


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def flags(args):
    """--key=value flags before the program, as a dict; the program and its arguments."""
    out = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            return out, args[i:]
        key, _, value = a.partition("=")
        out[key] = value
    return out, []


def expand(text, env):
    """Kubernetes' $(VAR) expansion in command and args; $$ escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def mount_of(pod, path):
    """(volume, mount) whose mountPath holds `path`."""
    container = pod["containers"][0]
    for m in container.get("volumeMounts", []):
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            vol = [v for v in pod["volumes"] if v["name"] == m["name"]]
            return (vol[0] if vol else None), m
    return None, None




class Manifests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rdzv = load("rendezvousd.yaml")
        cls.train = load("train-job.yaml")
        cls.deploy = one(cls.rdzv, "Deployment", "rendezvousd")
        cls.rdzv_svc = one(cls.rdzv, "Service", "rendezvousd")
        cls.job = one(cls.train, "Job")
        cls.headless = one(cls.train, "Service")
        cls.pvc = one(cls.train, "PersistentVolumeClaim")
        cls.dpod = cls.deploy["spec"]["template"]["spec"]
        cls.jpod = cls.job["spec"]["template"]["spec"]
        cls.dflags, _ = flags(cls.dpod["containers"][0]["args"])
        cls.jcontainer = cls.jpod["containers"][0]
        cls.jenv = {e["name"]: e for e in cls.jcontainer["env"]}

    def test_rendezvousd_port_is_the_same_everywhere(self):
        port = int(self.dflags["--port"])
        container = self.dpod["containers"][0]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        self.assertEqual(named["grpc"], port)
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(container[probe]["grpc"]["port"], port, probe)
        (svc_port,) = self.rdzv_svc["spec"]["ports"]
        target = svc_port["targetPort"]
        self.assertEqual(named[target] if isinstance(target, str) else target, port)
        self.assertLessEqual(self.rdzv_svc["spec"]["selector"].items(),
                             self.deploy["spec"]["template"]["metadata"]["labels"].items())
        # One store: one replica, never two side by side.
        self.assertEqual(self.deploy["spec"]["replicas"], 1)
        self.assertEqual(self.deploy["spec"]["strategy"]["type"], "Recreate")

    def test_tokens_come_from_one_secret(self):
        vol, _ = mount_of(self.dpod, self.dflags["--token-file"])
        self.assertIsNotNone(vol, "--token-file is not on a mounted volume")
        secret = vol["secret"]
        path = os.path.relpath(self.dflags["--token-file"], mount_of(self.dpod, self.dflags["--token-file"])[1]["mountPath"])
        self.assertIn({"key": "token", "path": path}, secret["items"])
        token_file = self.jenv["MUSTER_STORE_TOKEN_FILE"]["value"]
        jvol, jmount = mount_of(self.jpod, token_file)
        self.assertIsNotNone(jvol, "MUSTER_STORE_TOKEN_FILE is not on a mounted volume")
        self.assertEqual(jvol["secret"]["secretName"], secret["secretName"])
        self.assertIn({"key": "token", "path": os.path.relpath(token_file, jmount["mountPath"])}, jvol["secret"]["items"])

    def test_job_is_indexed_with_the_node_rank_from_the_index(self):
        spec = self.job["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        nnodes = int(self.jenv["PET_NNODES"]["value"])
        self.assertEqual(spec["completions"], nnodes)
        self.assertEqual(spec["parallelism"], nnodes)
        self.assertEqual(self.jenv["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.annotations['batch.kubernetes.io/job-completion-index']")
        self.assertIn("controller-uid", self.jenv["PET_RDZV_ID"]["valueFrom"]["fieldRef"]["fieldPath"])
        self.assertEqual(self.jpod["restartPolicy"], "Never")

    def test_job_reaches_rendezvousd_and_its_pods_by_the_services(self):
        jflags, program = flags(self.jcontainer["args"])
        host, _, port = jflags["--rdzv_endpoint"].partition(":")
        self.assertEqual(jflags["--rdzv_backend"], "c10d")
        self.assertEqual(host, self.rdzv_svc["metadata"]["name"])
        self.assertEqual(int(port), self.rdzv_svc["spec"]["ports"][0]["port"])
        # Pod names through the headless Service: <job>-<index>.<subdomain>.
        self.assertEqual(self.headless["spec"]["clusterIP"], "None")
        self.assertEqual(self.jpod["subdomain"], self.headless["metadata"]["name"])
        self.assertEqual(self.headless["spec"]["selector"], {"job-name": self.job["metadata"]["name"]})
        env = {"JOB_NAME": self.jenv["JOB_NAME"]["value"], "PET_NODE_RANK": "1"}
        self.assertEqual(self.jenv["JOB_NAME"]["value"], self.job["metadata"]["name"])
        self.assertEqual(expand(jflags["--local_addr"], env),
                         f"{self.job['metadata']['name']}-1.{self.headless['metadata']['name']}")
        self.assertEqual(self.jcontainer["command"], ["/usr/bin/launch"])
        self.assertEqual(program[0], "/usr/bin/worker")

    def test_shared_dir_is_a_read_write_many_volume(self):
        shared = self.jenv["MUSTER_SHARED_DIR"]["value"]
        vol, mount = mount_of(self.jpod, shared)
        self.assertIsNotNone(vol)
        self.assertEqual(vol["persistentVolumeClaim"]["claimName"], self.pvc["metadata"]["name"])
        self.assertIn("ReadWriteMany", self.pvc["spec"]["accessModes"])
        _, program = flags(self.jcontainer["args"])
        config = [a for a in program if a.startswith("--config=")][0].split("=", 1)[1]
        self.assertTrue(config.startswith(mount["mountPath"] + "/"), config)

    def test_a_stop_on_request_is_not_counted_as_a_failure_and_fits_the_grace(self):
        """The exit code the podFailurePolicy ignores is the one launch gives a clean stop (a
        real launch, stopped by --stop_at, says it); SIGTERM is a notice; the stop's timeout fits
        in the grace Kubernetes gives."""
        rules = self.job["spec"]["podFailurePolicy"]["rules"]
        codes = [r["onExitCodes"] for r in rules if r["action"] == "Ignore" and "onExitCodes" in r]
        self.assertEqual(len(codes), 1, rules)
        self.assertEqual((codes[0]["containerName"], codes[0]["operator"]), (self.jcontainer["name"], "In"))
        self.assertIn({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}, rules)
        jflags, _ = flags(self.jcontainer["args"])
        self.assertIn("SIGTERM", jflags["--stop_notice"].split(","))
        self.assertLess(float(jflags["--stop_timeout"]), self.jpod["terminationGracePeriodSeconds"])
        work = tempfile.mkdtemp(prefix="muster-k8s-stop-")
        self.addCleanup(shutil.rmtree, work, True)
        stopped = subprocess.run([os.path.join(BUILD, "launcher", "launch"), "--nproc_per_node=1", "--master_port=0",
                                  "--stop_at=1", "--no_python", os.path.join(BUILD, "tests", "integration", "stop_tool"),
                                  work, "0.001"], capture_output=True, text=True, timeout=120)
        self.assertIn("stopped at step", stopped.stderr)
        self.assertEqual(codes[0]["values"], [stopped.returncode], stopped.stderr)

    def test_what_the_manifests_describe_runs(self):
        """rendezvousd with the Deployment's args; the Job's two pods as two launches."""
        work = tempfile.mkdtemp(prefix="muster-k8s-")
        procs = []
        try:
            token_dir = os.path.join(work, "token")
            os.makedirs(token_dir)
            with open(os.path.join(token_dir, "token"), "w") as f:
                f.write("5ecret-from-the-secret\n")
            shared = os.path.join(work, "shared")
            os.makedirs(shared)
            port = free_port()
            # Paths and the port of the manifests, mapped onto this machine.
            def local(arg):
                arg = arg.replace("/etc/muster/token", token_dir).replace("/usr/bin/rendezvousd",
                                                                          os.path.join(BUILD, "rendezvous", "rendezvousd"))
                return re.sub(r"^--port=\d+$", f"--port={port}", arg)
            container = self.dpod["containers"][0]
            argv = [local(container["command"][0])] + [local(a) for a in container["args"]]
            self.assertIn(f"--token-file={token_dir}/token", argv)
            rdzvd = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(rdzvd)
            ctl = os.path.join(BUILD, "rendezvous", "rendezvousctl")
            health = subprocess.run([ctl, f"--addr=127.0.0.1:{port}", "--timeout=10", "health"],
                                    capture_output=True, text=True, timeout=30)
            self.assertEqual(health.returncode, 0, health.stderr)
            self.assertEqual(health.stdout.strip(), "SERVING")
            # The store itself refuses a client without the token.
            refused = subprocess.run([ctl, f"--addr=127.0.0.1:{port}", "--timeout=5", "get", "k"],
                                     capture_output=True, text=True, timeout=30)
            self.assertNotEqual(refused.returncode, 0)

            jflags, _ = flags(self.jcontainer["args"])
            pods = []
            for index in range(self.job["spec"]["completions"]):
                annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
                labels = {"controller-uid": "0f6c2d1e-job-uid", "job-name": self.job["metadata"]["name"]}
                env = dict(os.environ)
                for e in self.jcontainer["env"]:
                    if "value" in e:
                        env[e["name"]] = e["value"]
                        continue
                    path = e["valueFrom"]["fieldRef"]["fieldPath"]
                    m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
                    self.assertIsNotNone(m, path)
                    env[e["name"]] = (annotations if m.group(1) == "annotations" else labels)[m.group(2)]
                env["MUSTER_SHARED_DIR"] = shared
                env["MUSTER_STORE_TOKEN_FILE"] = env["MUSTER_STORE_TOKEN_FILE"].replace("/etc/muster/token", token_dir)
                args = [expand(a, env) for a in self.jcontainer["args"]]
                # Service and pod names resolve to this machine; the program is the self-check
                # (the manifest's training needs its data on the shared volume).
                svc = self.rdzv_svc["metadata"]["name"]
                args = [re.sub(rf"^--rdzv_endpoint={svc}:\d+$", f"--rdzv_endpoint=127.0.0.1:{port}", a) for a in args]
                args = [re.sub(r"^--local_addr=.*$", "--local_addr=127.0.0.1", a) for a in args]
                launch_flags, _ = flags(args)
                argv = [os.path.join(BUILD, "launcher", "launch")] + \
                       [f"{k}={v}" for k, v in launch_flags.items()] + \
                       [os.path.join(BUILD, "worker", "worker"), "--timeout=60"]
                pods.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            procs.extend(pods)
            outputs = [p.communicate(timeout=180) for p in pods]
            for p, (out, err) in zip(pods, outputs):
                self.assertEqual(p.returncode, 0, out + err)
            everything = "".join(o + e for o, e in outputs)
            self.assertIn("self-check passed: 4 rank(s), gloo", everything)
            self.assertIn("run '0f6c2d1e-job-uid' round 0: 2 node(s), world size 4", everything + self.daemon_log(rdzvd))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
            shutil.rmtree(work, ignore_errors=True)

    @staticmethod
    def daemon_log(proc):
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        return out or ""


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
