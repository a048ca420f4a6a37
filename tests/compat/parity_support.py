"""What the parity scripts share, read from with_torch.sh's variables: the torch under test
(MUSTER_TEST_PYTHON, MUSTER_TEST_TORCH), the flags launch needs to follow its torchrun
(MUSTER_TEST_LAUNCH_FLAGS) and a free port."""
import os
import re
import sys
import tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import reserve_port as free_port  # noqa: E402  (a port no test beside this one gets)

PY = os.environ["MUSTER_TEST_PYTHON"]
VERSION = os.environ["MUSTER_TEST_TORCH"]
MAJOR_MINOR = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", VERSION).groups())
LAUNCH_FLAGS = os.environ.get("MUSTER_TEST_LAUNCH_FLAGS", "").split()
TORCHRUN = os.environ["MUSTER_TEST_TORCHRUN"].split()
_torchrun_help = None


def torchrun_has(flag):
    """Whether this torch's torchrun takes `flag`, read once from its --help (a release that
    added a flag, as 2.11 --event-log-handler, is told by what it takes, not by its number)."""
    global _torchrun_help
    if _torchrun_help is None:
        import subprocess
        done = subprocess.run(TORCHRUN + ["--help"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:  # a broken torch must fail the cases, not skip them
            raise RuntimeError(f"{' '.join(TORCHRUN)} --help exited {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[-300:]}")
        _torchrun_help = done.stdout + done.stderr
    return re.search(re.escape(flag) + r"\b", _torchrun_help) is not None


def launch_argv(launch, args):
    """launch, told which torchrun to follow, with these arguments."""
    return [launch] + LAUNCH_FLAGS + list(args)


def run_cases(cases, one_side, compare, prefix, show=None):
    """Runs each case (dict with "name", "since" and optionally "needs", a torchrun flag, or a
    function that returns why this torch cannot run the case, None when it can) the torch has: one_side(case, "torch" or
    "launch", LAUNCH, WORK) for each side in a fresh folder, then compare(case, theirs, ours)
    -> (differences, kept). Prints one line per case, the differences and what is kept;
    show(side) adds what a failing case printed when PARITY_VERBOSE is set. argv: LAUNCH
    [CASE...]. Returns the exit code: 1 when any case differs."""
    launch = os.path.abspath(sys.argv[1])
    wanted = set(sys.argv[2:])
    failed = 0
    for c in cases:
        if wanted and c["name"] not in wanted:
            continue
        if MAJOR_MINOR < c["since"]:
            print(f"{c['name']}: not in torchrun {VERSION}")
            continue
        needs = c.get("needs")
        if callable(needs):  # a probe of this torch: None, or why the case cannot run on it
            why = needs()
            if why:
                print(f"{c['name']}: torch {VERSION} {why}")
                continue
        elif needs and not torchrun_has(needs):
            print(f"{c['name']}: torchrun {VERSION} has no {needs}")
            continue
        with tempfile.TemporaryDirectory(prefix=prefix) as work:
            try:
                theirs = one_side(c, "torch", launch, work)
                ours = one_side(c, "launch", launch, work)
            except Exception as e:  # one case's failure is reported, the others still run
                print(f"FAIL {c['name']}: {e}")
                failed += 1
                continue
            diffs, kept = compare(c, theirs, ours)
            if diffs and show and os.environ.get("PARITY_VERBOSE"):
                for who, side in (("torchrun", theirs), ("launch", ours)):
                    print(f"--- {who}:\n{show(side)}")
        if diffs:
            failed += 1
            print(f"FAIL {c['name']}: launch and torchrun {VERSION} differ")
            for d in diffs:
                print("   ", d)
        else:
            print(f"ok {c['name']}: the same under launch and torchrun {VERSION}")
        for k in sorted(kept):
            print(f"    kept: {k}")
    print(f"torch {VERSION}: {failed} case(s) differ" if failed
          else f"torch {VERSION}: every case the same")
    return 1 if failed else 0
