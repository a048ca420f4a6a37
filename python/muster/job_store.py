"""The job's store as a torch.distributed.Store: the store launch hosts for the workers (which
speaks TCPStore's protocol), keyed as torch's own env:// rendezvous keys it, so that a key set
here is the key a C++ rank (muster's worker library) and init_process_group's store see."""

import datetime
import os
import threading

import torch.distributed as dist

from .env import JobEnv

_lock = threading.Lock()
_cache = {}


def _connect(env, timeout):
    if env.world_size == 1 and (not env.master_addr or not env.master_port):
        return dist.HashStore()  # a world of one, not started by launch: in-process
    if not env.master_addr or not env.master_port:
        raise ValueError("MASTER_ADDR and MASTER_PORT are not set: start the program with "
                         "launch (or torchrun)")
    try:
        client = dist.TCPStore(env.master_addr, env.master_port, is_master=False,
                               timeout=datetime.timedelta(seconds=timeout),
                               wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        how = ("launch's store" if env.use_agent_store else
               "rank 0's TCPStore (TORCHELASTIC_USE_AGENT_STORE is not True, so rank 0's "
               "init_process_group hosts it: call muster.store() after init_process_group)")
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RuntimeError(f"cannot reach {how} at {env.master_addr}:{env.master_port}: "
                           f"{first}") from e
    if env.use_agent_store:
        # As torch's env:// rendezvous does under an agent store; launch files the keys under
        # the round, whatever the attempt number says.
        return dist.PrefixStore(f"/worker/attempt_{env.restart_count}", client)
    return client


def store(timeout=300.0):
    """The job's store (one connection per process, made on the first call).

    Under launch this is the workers' store launch serves at MASTER_ADDR:MASTER_PORT, in the
    namespace of the running round: keys of a restarted round never meet their predecessors'.
    ``timeout`` (seconds) bounds get() and wait(). Raises ValueError for a malformed
    environment and RuntimeError when the store cannot be reached.
    """
    env = JobEnv.from_environ()
    key = (os.getpid(), env.master_addr, env.master_port, env.restart_count, float(timeout))
    with _lock:
        if key not in _cache:
            _cache[key] = _connect(env, float(timeout))
        return _cache[key]
