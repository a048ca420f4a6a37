#!/usr/bin/env python3
"""rendezvous/'s layering: README.md's table names the folders, lowest first; a folder's code
may include its own headers and those of folders above it in the table, never below. Tests
(`*_test*`) may include anything. Also: every folder is in the table, no source lies loose in
rendezvous/, and every header opens with a comment saying what it is."""
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
LOOSE_OK = {"CMakeLists.txt", "README.md", "layering_test.py"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"rendezvous/([^/"]+)/([^"]+)"', re.M)


def layers(readme):
    order = re.findall(r"^\| `([a-z_]+)/` \|", readme, re.M)
    if not order:
        sys.exit(f"README.md: no layer table (rows '| `folder/` | ...')")
    return {name: i for i, name in enumerate(order)}


def main():
    rank = layers((HERE / "README.md").read_text())
    problems = []
    for entry in sorted(HERE.iterdir()):
        if entry.is_dir():
            if entry.name not in rank and entry.name != "__pycache__":
                problems.append(f"rendezvous/{entry.name}/ is not in README.md's layer table")
        elif entry.name not in LOOSE_OK:
            problems.append(f"rendezvous/{entry.name} lies outside every folder")
    for folder in rank:
        if not (HERE / folder).is_dir():
            problems.append(f"README.md's table names rendezvous/{folder}/, which does not exist")
    checked = 0
    for path in sorted(HERE.glob("*/*")):
        if path.suffix not in (".h", ".cc") or path.parent.name not in rank:
            continue
        text = path.read_text()
        rel = path.relative_to(HERE.parent)
        if path.suffix == ".h" and not text.startswith("//"):
            problems.append(f"{rel}: a header opens with a comment saying what it owns")
        if "_test" in path.name:
            continue
        checked += 1
        own = rank[path.parent.name]
        for folder, name in INCLUDE.findall(text):
            if folder not in rank:
                problems.append(f"{rel}: includes rendezvous/{folder}/{name}, not a known folder")
            elif rank[folder] > own:
                problems.append(f"{rel}: includes rendezvous/{folder}/{name}: {folder}/ is a "
                                f"layer above {path.parent.name}/ (README.md's table)")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{checked} files in {len(rank)} layers: every include goes down or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main())
