# Three ranks with gloo: rank 1 is stuck in a function before an all_reduce that the others
# have entered. With TIMER_SCOPE set, rank 1 holds a 1 s file timer (FileTimerClient) over
# its stuck call instead. With EXIT_WHEN set, every rank waits for that file and exits 0.
import os
import sys
import time

import torch
import torch.distributed as dist


def stuck_in_loader():
    if os.environ.get("EXIT_WHEN"):
        while not os.path.exists(os.environ["EXIT_WHEN"]):
            time.sleep(0.02)
        return
    time.sleep(3600)


def train_step(rank):
    t = torch.ones(4)
    if rank == 1:
        scope = os.environ.get("TIMER_SCOPE")
        if scope:
            import torch.distributed.elastic.timer as timer
            timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
            with timer.expires(after=1, scope=scope):
                stuck_in_loader()
        else:
            stuck_in_loader()
    dist.all_reduce(t)
    return t


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} ready", flush=True)
    # The tensor lives past destroy_process_group: torch 2.6's ~ProcessGroupGloo holds the GIL
    # while it joins Gloo's worker thread, and that thread, when it drops the all_reduce's last
    # reference to a tensor Python has let go of, waits for the GIL to free the tensor's
    # PyObject: a deadlock, seen here under load (fixed upstream after 2.6, pytorch#154976).
    kept = train_step(rank)
    dist.destroy_process_group()
    del kept


main()
