"""torchrun's own etcd rendezvous, for tests/bench/etcd_bench: THREADS agents in this process,
each with its own handler (and so its own etcd client), join one round of NODES through
BACKEND ("etcd": EtcdRendezvousHandler; "etcd-v2": DynamicRendezvousHandler over
EtcdRendezvousBackend), both on etcd's v2 API through python3-etcd. Prints one line per agent:
"<monotonic start ns> <monotonic done ns>". The handlers made, it creates MARK, then waits for
GO, a file whose existence starts every process's agents at once.

    python3 torch_etcd_rdzv.py BACKEND HOST:PORT RUN_ID NODES THREADS MARK GO
"""
import logging
import os
import sys
import threading
import time

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler


def agent(handler, go, out, lock):
    while not os.path.exists(go):
        time.sleep(0.001)
    start = time.monotonic_ns()
    handler.next_rendezvous()
    done = time.monotonic_ns()
    with lock:
        out.append((start, done))


def main():
    logging.disable(logging.INFO)  # torch's handlers log every step of every agent
    backend, endpoint, run_id = sys.argv[1], sys.argv[2], sys.argv[3]
    nodes, threads, mark, go = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
    params = RendezvousParameters(backend=backend, endpoint=endpoint, run_id=run_id, min_nodes=nodes,
                                  max_nodes=nodes, timeout=600, join_timeout=600, last_call_timeout=1)
    handlers = [get_rendezvous_handler(params) for _ in range(threads)]
    out, lock = [], threading.Lock()
    workers = [threading.Thread(target=agent, args=(h, go, out, lock)) for h in handlers]
    open(mark, "w").close()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for start, done in out:
        print(start, done)
    sys.stdout.flush()
    # The etcd-v2 handler's keep-alive threads are not daemons: leave without waiting for them.
    os._exit(0 if len(out) == threads else 1)


if __name__ == "__main__":
    main()
