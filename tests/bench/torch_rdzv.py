"""torch's own c10d rendezvous (DynamicRendezvousHandler over C10dRendezvousBackend and a
TCPStore), for tests/bench/rdzv_bench: THREADS agents in this process join a round of NODES.
Prints one line per agent: "<monotonic start ns> <monotonic done ns>".

    python3 torch_rdzv.py HOST PORT RUN_ID NODES THREADS
"""
import sys
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)


def agent(host, port, run_id, nodes, out, lock):
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=300))
    backend = C10dRendezvousBackend(store, run_id)
    handler = DynamicRendezvousHandler.from_backend(
        run_id, store, backend, nodes, nodes,
        RendezvousTimeout(join=timedelta(seconds=300), last_call=timedelta(seconds=1)))
    start = time.monotonic_ns()
    handler.next_rendezvous()
    done = time.monotonic_ns()
    with lock:
        out.append((start, done))


def main():
    host, port, run_id, nodes, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    out, lock = [], threading.Lock()
    workers = [threading.Thread(target=agent, args=(host, port, run_id, nodes, out, lock)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for start, done in out:
        print(start, done)


if __name__ == "__main__":
    main()
