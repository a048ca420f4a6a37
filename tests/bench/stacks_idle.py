# A Python rank for stacks_bench.sh: says it is ready, then waits in a function of its own
# until the file named exists.
import os
import sys
import time


def waiting_in_python(path):
    while not os.path.exists(path):
        time.sleep(0.05)


print(f"rank {os.environ['RANK']} pid {os.getpid()} ready", flush=True)
waiting_in_python(sys.argv[1])
