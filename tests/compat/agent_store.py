"""Where the workers' store lives, as an unmodified PyTorch script sees it.

usage: agent_store.py leave OUT     rank 0 returns right after the first barrier; the others
                                    keep using the store for a while, then write OUT/<rank>.json
       agent_store.py restart OUT   attempt 0: rank 0 sets a key, rank 1 fails; attempt 1: every
                                    rank looks for the key and writes what it saw
"""
import datetime
import json
import os
import sys
import time

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store


def main():
    mode, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    store = _get_default_store()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if mode == "leave":
        dist.barrier()
        if rank == 0:
            return  # a rank 0 that is done early: under torchrun 1.13 the others go on
        time.sleep(1.0)
        for i in range(20):
            store.set(f"after-{rank}-{i}", str(i))
            assert store.get(f"after-{rank}-{i}") == str(i).encode()
        total = store.add("leavers", 1)
        with open(os.path.join(out, f"{rank}.json"), "w") as f:
            json.dump({"rank": rank, "ok": True, "counted": total >= 1}, f)
        return
    if mode == "restart":
        if attempt == 0:
            if rank == 0:
                store.set("from-attempt-0", "stale")
            dist.barrier()
            if rank == 1:
                sys.exit(1)
            time.sleep(30)  # stopped by the agent
            return
        store.set_timeout(datetime.timedelta(milliseconds=500))
        try:
            store.get("from-attempt-0")
            seen = True
        except RuntimeError:
            seen = False
        with open(os.path.join(out, f"{rank}.json"), "w") as f:
            json.dump({"rank": rank, "attempt": attempt, "saw_attempt_0": seen}, f)
        return


if __name__ == "__main__":
    main()
