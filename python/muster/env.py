"""The job as launch (or torchrun) describes it to a worker: torchrun's variables and muster's
MUSTER_* ones, read and checked once."""

import os
from dataclasses import dataclass


def _int(env, name, minimum, default=None):
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{name} is not set: start the program with launch (or torchrun), "
                             f"or set {name}")
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"{name}={raw!r} is invalid; expected an integer >= {minimum}")
    return value


@dataclass(frozen=True)
class JobEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    restart_count: int
    round: int  # launch's rendezvous round (MUSTER_ROUND); the restart count elsewhere
    run_id: str
    job_id: str  # the job's folder in the shared directory
    master_addr: str
    master_port: int
    use_agent_store: bool
    shared_dir: str
    progress_fifo: str

    @staticmethod
    def from_environ(env=None):
        """Raises ValueError naming the variable when one is missing or malformed."""
        env = os.environ if env is None else env
        rank = _int(env, "RANK", 0, 0 if "WORLD_SIZE" not in env else None)
        world = _int(env, "WORLD_SIZE", 1, 1)
        local_rank = _int(env, "LOCAL_RANK", 0, rank)
        local_world = _int(env, "LOCAL_WORLD_SIZE", 1, world)
        if rank >= world:
            raise ValueError(f"RANK={rank} is out of range for WORLD_SIZE={world}")
        if local_rank >= local_world or local_world > world:
            raise ValueError(f"LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world} do not "
                             f"fit WORLD_SIZE={world}")
        group_world = _int(env, "GROUP_WORLD_SIZE", 1, max(1, world // local_world))
        group_rank = _int(env, "GROUP_RANK", 0, 0)
        if group_rank >= group_world:
            raise ValueError(f"GROUP_RANK={group_rank} is out of range for "
                             f"GROUP_WORLD_SIZE={group_world}")
        restarts = _int(env, "TORCHELASTIC_RESTART_COUNT", 0, 0)
        port = _int(env, "MASTER_PORT", 1, 0) if env.get("MASTER_PORT") else 0
        if port > 65535:
            raise ValueError(f"MASTER_PORT={port} is invalid; expected a port 1-65535")
        run_id = env.get("TORCHELASTIC_RUN_ID") or "none"  # the C++ library's default too
        return JobEnv(
            rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
            group_rank=group_rank, group_world_size=group_world, restart_count=restarts,
            round=_int(env, "MUSTER_ROUND", 0, restarts), run_id=run_id,
            job_id=env.get("MUSTER_JOB_ID") or run_id,
            master_addr=env.get("MASTER_ADDR", ""), master_port=port,
            use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "") in ("True", "true", "1"),
            shared_dir=env.get("MUSTER_SHARED_DIR", ""),
            progress_fifo=env.get("MUSTER_PROGRESS_FIFO", ""))
