"""A rank for test_stop.py: a training loop that asks muster.stop_requested(step) every step.

usage: stop_worker.py MODE OUT [SECONDS_PER_STEP]
  ddp     a Gloo DDP step (a small model, an all-reduce of its gradients) per step
  fast    no collective: as many steps a second as Python runs
  slow    SECONDS_PER_STEP of sleep per step
  never   a loop that never asks (an unmodified script): writes OUT/<RANK>.signal on SIGUSR1
          and goes on
  resume  SECONDS_PER_STEP of sleep per step, from muster.resumed_from_step() (written to
          OUT/<RANK>.resumed, "none" on a fresh start); a resumed rank ends (exit 0) 20 steps on
  ends    SECONDS_PER_STEP of sleep per step, asking first about step 300 (which moves the board's
          horizon past it), then about every step; ends (exit 0) at step 300
  restart SECONDS_PER_STEP of sleep per step; in the first round (TORCHELASTIC_RESTART_COUNT 0)
          RANK 0 exits 3 at step 30 and the others, on SIGTERM, write OUT/<RANK>.term and take
          1.5 s to exit; a later round starts at step 1000, as if from a checkpoint
Each asking rank writes OUT/<RANK>.step (its latest step, now and then) while it runs, and
OUT/<RANK>.stop ("<step> <the steps it was told False, counted>") when told True, then exits 0
(STOP_WORKER_LINGER seconds later when set).
"""
import os
import signal
import sys
import time

import muster


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv):
    mode, out = argv[1], argv[2]
    per_step = float(argv[3]) if len(argv) > 3 else 0.0
    rank = os.environ["RANK"]
    if mode == "never":
        signal.signal(signal.SIGUSR1, lambda *_: write(os.path.join(out, f"{rank}.signal"), "SIGUSR1"))
        write(os.path.join(out, f"{rank}.step"), "0")
        while True:
            time.sleep(0.05)
    step_fn, done = None, None
    if mode == "ddp":
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.randn(8, 16)

        def step_fn():
            opt.zero_grad()
            model(data).sum().backward()
            opt.step()
        done = dist.destroy_process_group
    told_false = 0
    last_written = 0.0
    step, fail_at = 0, None
    if mode == "restart":
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            def on_term(*_):
                write(os.path.join(out, f"{rank}.term"), "SIGTERM")
                time.sleep(1.5)
                os._exit(143)
            signal.signal(signal.SIGTERM, on_term)
            fail_at = 30 if rank == "0" else None
        else:
            step = 1000
    end = None
    if mode == "ends":
        end = 300
        if muster.stop_requested(end):
            return 0
    if mode == "resume":
        resumed = muster.resumed_from_step()
        write(os.path.join(out, f"{rank}.resumed"), "none" if resumed is None else str(resumed))
        if resumed is not None:
            step, end = resumed, resumed + 20
    while True:
        if step == fail_at:
            return 3
        if step == end:
            return 0
        if muster.stop_requested(step):
            write(os.path.join(out, f"{rank}.stop"), f"{step} {told_false}")
            time.sleep(float(os.environ.get("STOP_WORKER_LINGER", "0")))
            if done:
                done()
            return 0
        told_false += 1
        if step_fn:
            step_fn()
        if per_step:
            time.sleep(per_step)
        now = time.monotonic()
        if now - last_written > 0.05:
            write(os.path.join(out, f"{rank}.step"), str(step))
            last_written = now
        step += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
