"""What a rank sees: its environment, arguments and working directory, written to
OUT/<RANK>.json (OUT: the last argument). Imports nothing of torch, so that it starts fast under
any Python; run as a script, as a module (-m env_dump) or by path."""
import json
import os
import sys


def main():
    out = sys.argv[-1]
    with open(os.path.join(out, os.environ["RANK"] + ".json"), "w") as f:
        json.dump({"env": dict(os.environ), "argv": sys.argv[1:], "cwd": os.getcwd()}, f)


if __name__ == "__main__":
    main()
