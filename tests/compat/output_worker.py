"""A rank for output_parity.py: writes marked lines to stdout and stderr, then ends as
OUTPUT_END says for the rank named by OUTPUT_RANK (the others finish after OUTPUT_SLEEP s):
  ok        exit 0
  raise     raise ValueError in a @record main (torchelastic writes the error file)
  exit      sys.exit(3), no @record (no error file)
  segv      SIGSEGV from within (torchelastic's fault handler on)
  timer     a FileTimerClient timer of 1 s around a 60 s sleep (torchrun kills the rank)
Its one argument is a tag the test finds left workers by; each rank, once its lines are out,
makes the file TAG.linesRANK, and the chosen rank ends only when every rank has (under load a
rank's start can lag the others' by seconds).
"""
import os
import signal
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record

RANK = int(os.environ["RANK"])
END = os.environ.get("OUTPUT_END", "ok")
CHOSEN = os.environ.get("OUTPUT_RANK", "1") == str(RANK)
TAG = sys.argv[1]


def lines():
    for i in range(3):
        print(f"LINE out rank={RANK} n={i}", flush=True)
        print(f"LINE err rank={RANK} n={i}", file=sys.stderr, flush=True)
    # A last line without its newline.
    sys.stdout.write(f"LINE out rank={RANK} tail")
    sys.stdout.flush()
    open(f"{TAG}.lines{RANK}", "w").close()


def others_wrote_their_lines():
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 120
    while not all(os.path.exists(f"{TAG}.lines{r}") for r in range(world)):
        if time.monotonic() > deadline:
            sys.exit(f"rank {RANK}: the other ranks never wrote their lines")
        time.sleep(0.05)


def end():
    if not CHOSEN or END == "ok":
        time.sleep(float(os.environ.get("OUTPUT_SLEEP", "0")))
        return
    others_wrote_their_lines()
    if END == "raise":
        raise ValueError(f"boom on rank {RANK}")
    if END == "exit":
        sys.exit(3)
    if END == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if END == "timer":
        from torch.distributed.elastic import timer
        timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with timer.expires(after=1, scope="load"):
            time.sleep(60)


@record
def main():
    lines()
    end()


if __name__ == "__main__":
    if END == "exit":
        lines()
        end()
    else:
        main()
