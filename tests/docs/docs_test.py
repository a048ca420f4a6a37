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
   "cwd": "source" runs it in the source tree (else in $TMP); "concurrent": true runs each command
   at once (the nodes of a job) and waits for all; "each_node": N runs a command whose comment
   says "on each node" N times at once; "env": {"NAME": "value"} for the block (the same
   $-names); "timeout": seconds (default 300). A command ending in "&" runs in the background
   and is stopped when the block ends. The build's programs are first on PATH.

Prints one line per problem ("docs/page.md:LINE: ...") and exits 1 if there is any.
"""
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_links  # noqa: E402

PROGRAMS = {"launch": "launcher/launch", "rendezvousd": "rendezvous/rendezvousd",
            "rendezvousctl": "rendezvous/rendezvousctl", "worker": "worker/worker"}
MARK = re.compile(r"^<!--\s*docs-test\s+(\{.*\})\s*-->\s*$")


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


def value_flags(text):
    """The flags of `launch --help` that take a value (a " V" after the names)."""
    found = set()
    for line in text.splitlines():
        m = re.match(r"^\s+((?:-{1,2}[\w-]+(?:, )?)+)\s+V\b", line)
        if m:
            found |= {n.strip() for n in m.group(1).split(",")}
    return found


def check_flags(build, rel, number, command):
    problems = []
    w = words(command)
    for i, word in enumerate(w):
        program = program_of(word)
        if not program or (i > 0 and w[i - 1] in ("install", "-f")):
            continue
        args = w[i + 1:]
        if program == "launch":
            text = help_text(build, "launch")
            takes = value_flags(text)
            j = 0
            while j < len(args) and args[j].startswith("-"):
                flag = args[j].split("=")[0]
                spellings = {flag, flag.replace("_", "-"), flag.replace("-", "_").replace("__", "--", 1)}
                if not any(re.search(r"(^|[\s,])" + re.escape(s) + r"($|[\s,])", text, re.M) for s in spellings):
                    problems.append(f"{rel}:{number}: launch has no flag {flag} (launch --help)")
                j += 2 if "=" not in args[j] and spellings & takes else 1
            if j < len(args) and program_of(args[j]):  # launch ... worker train --config
                problems += check_flags(build, rel, number, " ".join(args[j:]))
            return problems
        sub = next((a for a in args if not a.startswith("-")), None) if program in ("rendezvousctl", "worker") else None
        texts = help_text(build, program)
        if sub and re.search(r"^\s+" + re.escape(sub) + r"\b", texts, re.M):
            texts += help_text(build, program, sub)
        for a in args:
            if a.startswith("--"):
                flag = a.split("=")[0]
                if not re.search(re.escape(flag) + r"\b", texts):
                    problems.append(f"{rel}:{number}: {program} has no flag {flag} ({program}"
                                    f"{' ' + sub if sub else ''} --help)")
        return problems
    return problems


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    if opts.get("concurrent"):
        for k, c in enumerate(cmds):
            lines.append(f"( {c} ) & p{k}=$!")
        lines += [f"wait $p{k}" for k in range(len(cmds))]
        return "\n".join(lines)
    for c in cmds:
        if "on each node" in c and opts.get("each_node"):
            code = c.split(" #")[0]
            n = int(opts["each_node"])
            lines += [f"( {code} ) & n{k}=$!" for k in range(n)] + [f"wait $n{k}" for k in range(n)]
        else:
            lines.append(c)
    return "\n".join(lines)


def run_block(source, build, rel, number, body, opts):
    with tempfile.TemporaryDirectory(prefix="muster-docs-") as tmp:
        names = {"$TMP": tmp, "$PORT": str(free_port()), "$BUILD": build, "$SOURCE": source}
        script = script_of(body, opts, names)
        env = dict(os.environ)
        env.update({k: expand(v, names) for k, v in opts.get("env", {}).items()})
        env["PATH"] = os.pathsep.join(os.path.join(build, os.path.dirname(p)) for p in PROGRAMS.values()) \
            + os.pathsep + env.get("PATH", "")
        cwd = source if opts.get("cwd") == "source" else tmp
        p = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=float(opts.get("timeout", 300)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            return [f"{rel}:{number}: the block did not end within {opts.get('timeout', 300)} s:\n"
                    + out.decode(errors="replace")[-3000:]]
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        if p.returncode != 0:
            return [f"{rel}:{number}: the block exited {p.returncode}:\n{script}\n--- output:\n"
                    + out.decode(errors="replace")[-3000:]]
        print(f"ran {rel}:{number}")
        return []


def main():
    if len(sys.argv) != 3:
        print("usage: docs_test.py SOURCE BUILD", file=sys.stderr)
        return 2
    source, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    sys.argv = [sys.argv[0], source]
    problems = []
    import io
    import contextlib
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        links_rc = check_links.main()
    problems += [l for l in said.getvalue().splitlines() if l]
    if links_rc and not problems:
        problems.append("check_links.py failed")
    ran = 0
    for path in check_links.markdown_files(source):
        rel = os.path.relpath(path, source)
        for number, body, mark in sh_blocks(path):
            uses = any(program_of(w) for c in commands(body) for w in words(c))
            if not uses:
                continue
            for k, c in enumerate(commands(body)):
                problems += check_flags(build, rel, number + k, c)
            if mark is None:
                problems.append(f"{rel}:{number}: a block that runs muster's programs needs a "
                                '<!-- docs-test {"run": {...}} --> or {"skip": "why"} mark above it')
                continue
            try:
                spec = json.loads(mark)
            except ValueError as e:
                problems.append(f"{rel}:{number}: its docs-test mark is not JSON: {e}")
                continue
            if "run" in spec:
                problems += run_block(source, build, rel, number, body, spec["run"])
                ran += 1
            elif not spec.get("skip"):
                problems.append(f"{rel}:{number}: a skip mark says why")
    for p in problems:
        print(p)
    print(f"docs: {ran} block(s) run, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
