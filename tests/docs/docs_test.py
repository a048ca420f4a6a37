#!/usr/bin/env python3
"""The README and the pages under docs/, checked against the tree and the programs built.

    python3 tests/docs/docs_test.py SOURCE BUILD

1. Links and the README's shape: check_links.py (every relative link and #anchor resolves, the
   README under 200 lines and starting with the two commands).
2. Every command line of a `sh` block that runs one of muster's programs (launch, rendezvousd,
   rendezvousctl, worker): each flag it uses is one that program's --help names (a subcommand's
   own --help for its flags), so a page cannot keep a flag that was renamed or removed.
3. Every `sh` block that runs one of the programs says, in an HTML comment just above it, what
   this test does with it:
       <!-- docs-test {"run": {...}} -->      run it here (see below); it must exit 0
       <!-- docs-test {"skip": "why"} -->     not here (it needs a GPU, systemd, a cluster, ...)
   "run" options: "sub": {"text": "replacement"} applied to the block first ($TMP: a fresh
   folder, $PORT: a free TCP port, $BUILD: the build tree, $SOURCE: the source tree);
   "copy": [folders of the source tree] copied into $TMP, where the block runs; "concurrent":
   true runs each command
   at once (the nodes of a job) and waits for all; "each_node": N runs a command whose comment
   says "on each node" N times at once; "env": {"NAME": "value"} for the block (the same
   $-names); "timeout": seconds (default 120). A command ending in "&" is a service the next
   commands use: with "wait_port": true the block waits until $PORT answers, and the service
   must still be running at the block's end (it is stopped then). The build's programs are
   first on PATH. "$ command" lines of other fences (transcripts) have their flags checked.

Prints one line per problem ("docs/page.md:LINE: ...") and exits 1 if there is any.
"""
import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_links  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ports import reserve_port as free_port  # noqa: E402  (a port no test beside this one gets)

PROGRAMS = {"launch": "launcher/launch", "rendezvousd": "rendezvous/rendezvousd",
            "rendezvousctl": "rendezvous/rendezvousctl", "worker": "worker/worker"}
MARK = re.compile(r"^<!--\s*docs-test\s+(\{.*\})\s*-->\s*$")


def transcripts(path):
    """(line number, command) of each "$ command" line in a fence that is not sh: a session's
    transcript, whose commands are checked but not run."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, fence = [], None
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:]
            continue
        if fence is not None and fence not in ("sh", "bash", "console") and line.startswith("$ "):
            found.append((number, line[2:]))
    return found


def sh_blocks(path):
    """(first line number, [lines], mark or None) of each ```sh block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() in ("```sh", "```bash", "```console"):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            above = next((l for l in reversed(lines[:start - 1]) if l.strip()), "")
            m = MARK.match(above.strip())
            blocks.append((start + 1, body, m.group(1) if m else None))
        i += 1
    return blocks


def commands(body):
    """The block's commands: a line ending in a backslash joined with the next, an indented line
    of flags ("  [--flag V]") with the one before."""
    out, current = [], []
    for line in body:
        if line.rstrip().endswith("\\"):
            current.append(line.rstrip()[:-1].rstrip())
            continue
        if not current and out and line[:1].isspace() and line.lstrip()[:1] in ("[", "-"):
            out[-1] += " " + line.strip()  # a synopsis's next line: [--flag V] ...
            continue
        out.append(" ".join(current + [line]))
        current = []
    if current:
        out.append(" ".join(current))
    return out


def program_of(word):
    base = os.path.basename(word)
    return base if base in PROGRAMS else None


def words(command):
    code = command.split(" #")[0] if not command.lstrip().startswith("#") else ""
    try:
        return shlex.split(code.replace("[", " ").replace("]", " "))
    except ValueError:
        return code.split()


HELP = {}


def help_text(build, program, sub=None):
    key = (program, sub)
    if key not in HELP:
        argv = [os.path.join(build, PROGRAMS[program])] + ([sub] if sub else []) + ["--help"]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        HELP[key] = p.stdout.decode(errors="replace")
    return HELP[key]


def help_options(text):
    """{option name: takes a value} for the options a --help lists at the start of its lines:
    launch's "  --x_y, --x-y V" (V: a value), CLI11's "  -h,--help" and "  --port INT"."""
    options = {}
    for line in text.splitlines():
        m = re.match(r"^\s+(-{1,2}[\w-]+(?:,\s?-{1,2}[\w-]+)*)(\s+V\b)?", line)
        if m:
            options.update({n.strip(): bool(m.group(2)) for n in m.group(1).split(",")})
    return options


def check_flags(build, rel, number, command):
    problems = []
    w = words(command)
    for i, word in enumerate(w):
        program = program_of(word)
        if not program or (i > 0 and w[i - 1] in ("install", "-f")):
            continue
        args = w[i + 1:]
        if program == "launch":
            options = help_options(help_text(build, "launch"))
            j = 0
            while j < len(args) and args[j].startswith("-"):
                flag = args[j].split("=")[0]
                spellings = {flag, "--" + flag[2:].replace("_", "-"), "--" + flag[2:].replace("-", "_")} \
                    if flag.startswith("--") else {flag}
                known = spellings & options.keys()
                if not known:
                    problems.append(f"{rel}:{number}: launch has no flag {flag} (launch --help)")
                j += 2 if "=" not in args[j] and any(options[k] for k in known) else 1
            if j < len(args) and program_of(args[j]):  # launch ... worker train --config
                problems += check_flags(build, rel, number, " ".join(args[j:]))
            return problems
        sub = next((a for a in args if not a.startswith("-")), None) if program in ("rendezvousctl", "worker") else None
        texts = help_text(build, program)
        if sub and re.search(r"^\s+" + re.escape(sub) + r"\b", texts, re.M):
            texts += help_text(build, program, sub)
        known = help_options(texts)
        for a in args:
            if a.startswith("--"):
                flag = a.split("=")[0]
                if flag not in known:
                    problems.append(f"{rel}:{number}: {program} has no flag {flag} ({program}"
                                    f"{' ' + sub if sub else ''} --help)")
        return problems
    return problems




def expand(text, names):
    for name, value in names.items():
        text = text.replace(name, value)
    return text


def script_of(body, opts, names):
    text = "\n".join(body)
    for a, b in opts.get("sub", {}).items():
        text = text.replace(a, expand(b, names))
    cmds = [c for c in commands(text.split("\n")) if c.strip() and not c.lstrip().startswith("#")]
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for folder in opts.get("copy", []):
        lines.append(f"cp -r {shlex.quote(os.path.join(names['$SOURCE'], folder))} .")
    if opts.get("concurrent"):
        for k, c in enumerate(cmds):
            lines.append(f"( {c} ) & p{k}=$!")
        lines += [f"wait $p{k}" for k in range(len(cmds))]
        return "\n".join(lines)
    daemons = []
    for c in cmds:
        code = c.split(" #")[0].rstrip()
        if "on each node" in c and opts.get("each_node"):
            n = int(opts["each_node"])
            lines += [f"( {code} ) & n{k}=$!" for k in range(n)] + [f"wait $n{k}" for k in range(n)]
        elif code.endswith("&"):
            # A service the next commands use: it must come up, and still be up at the end.
            k = len(daemons)
            daemons.append(f"d{k}")
            lines.append(f"{code} d{k}=$!")
            if opts.get("wait_port"):
                lines.append(f"for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{names['$PORT']}) "
                             f"2>/dev/null && break; kill -0 $d{k} || exit 1; sleep 0.05; done")
        else:
            lines.append(c)
    lines += [f'kill -0 ${d} || {{ echo "a background service of the block is gone"; exit 1; }}'
              for d in daemons]
    return "\n".join(lines)


def run_block(source, build, rel, number, body, opts):
    timeout = float(opts.get("timeout", 120))
    with tempfile.TemporaryDirectory(prefix="muster-docs-") as tmp:
        names = {"$TMP": tmp, "$PORT": str(free_port()), "$BUILD": build, "$SOURCE": source}
        script = script_of(body, opts, names)
        env = dict(os.environ)
        env.update({k: expand(v, names) for k, v in opts.get("env", {}).items()})
        env["PATH"] = os.pathsep.join(os.path.join(build, os.path.dirname(p)) for p in PROGRAMS.values()) \
            + os.pathsep + env.get("PATH", "")
        p = subprocess.Popen(["bash", "-c", script], cwd=tmp, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            return [f"{rel}:{number}: the block did not end within {timeout:g} s:\n{script}\n--- output:\n"
                    + out.decode(errors="replace")[-3000:]]
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        if p.returncode != 0:
            return [f"{rel}:{number}: the block exited {p.returncode}:\n{script}\n--- output:\n"
                    + out.decode(errors="replace")[-3000:]]
        print(f"ran {rel}:{number}", flush=True)
        return []


def say(found):
    """Prints problems as they are found (a test killed at its timeout still shows them)."""
    for line in found:
        print(line, flush=True)
    return found


def main():
    if len(sys.argv) != 3:
        print("usage: docs_test.py SOURCE BUILD", file=sys.stderr)
        return 2
    source, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    sys.argv = [sys.argv[0], source]
    problems = []
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        links_rc = check_links.main()
    problems += say([line for line in said.getvalue().splitlines() if line])
    if links_rc and not problems:
        problems += say(["check_links.py failed"])
    ran = 0
    for path in check_links.markdown_files(source):
        rel = os.path.relpath(path, source)
        for number, command in transcripts(path):
            problems += say(check_flags(build, rel, number, command))
        for number, body, mark in sh_blocks(path):
            uses = any(program_of(w) for c in commands(body) for w in words(c))
            if not uses:
                continue
            for k, c in enumerate(commands(body)):
                problems += say(check_flags(build, rel, number + k, c))
            if mark is None:
                problems += say([f"{rel}:{number}: a block that runs muster's programs needs a "
                                 '<!-- docs-test {"run": {...}} --> or {"skip": "why"} mark above it'])
                continue
            try:
                spec = json.loads(mark)
            except ValueError as e:
                problems += say([f"{rel}:{number}: its docs-test mark is not JSON: {e}"])
                continue
            if "run" in spec:
                problems += say(run_block(source, build, rel, number, body, spec["run"]))
                ran += 1
            elif not spec.get("skip"):
                problems += say([f"{rel}:{number}: a skip mark says why"])
    print(f"docs: {ran} block(s) run, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
