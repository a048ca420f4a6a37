"""The ranks of PyTorch's launcher tests (test/distributed/launcher/bin/ and the entry points of
test/distributed/elastic/agent/server/test/local_elastic_agent_test.py), written anew from what
they do, for elastic_parity.py. usage: elastic_worker.py MODE OUT [ARG...]; what a rank has to
say it writes under OUT, named by its RANK.

  touch [--fail]   reads the 16 variables the launcher tests' script reads (a missing one fails
                   the rank), then creates OUT/<RANK>; --fail raises instead
  launched         writes torch.distributed.is_torchelastic_launched() to OUT/launched
  init METHOD      init_process_group("gloo", METHOD, WORLD_SIZE, RANK), then an all_reduce of a
                   one-hot tensor that must sum to the world size
  kill_self        rank 1 of the first attempt sends itself SIGKILL; every rank of a later
                   attempt creates OUT/<RANK>.<attempt>
  bipolar          odd ranks raise (a second after the start, so that the even ranks have made
                   their file); even ranks create OUT/<RANK>.<attempt>
  env NAME...      writes each NAME's value (or <unset>) to OUT/<RANK>.env
  error_file JSON  writes JSON to $TORCHELASTIC_ERROR_FILE and exits 1 (rank 0 only; the
                   others end well)
  drift SECONDS    sleeps SECONDS times its GROUP_RANK (the nodes end that far apart), then
                   creates OUT/<RANK>
  rpc MESSAGE      init_rpc under its ROLE_NAME; the role "master" calls the role "worker" with
                   MESSAGE and writes the answer to OUT/master
"""
import os
import signal
import sys
import time

VARIABLES = ["LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
             "WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
             "OMP_NUM_THREADS", "TEST_SENTINEL_PARENT", "TORCHELASTIC_ERROR_FILE"]


def touch(path):
    open(path, "w").close()


def echo(message):
    """Runs in the rank called over RPC."""
    return f"{message} from {os.environ['ROLE_NAME']}"


def main(argv):
    mode, out, args = argv[1], argv[2], argv[3:]
    rank = os.environ["RANK"]
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    if mode == "touch":
        for name in VARIABLES:
            print(f"{name} = {os.environ[name]}")
        if "--fail" in args:
            raise RuntimeError("raising exception since --fail flag was set")
        touch(os.path.join(out, rank))
    elif mode == "launched":
        import torch.distributed as dist
        with open(os.path.join(out, "launched"), "w") as f:
            f.write(str(dist.is_torchelastic_launched()))
    elif mode == "init":
        import torch
        import torch.distributed as dist
        world = int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", init_method=args[0], world_size=world, rank=int(rank))
        t = torch.zeros(world)
        t[int(rank)] = 1
        dist.all_reduce(t)
        if int(t.sum().item()) != world:
            raise RuntimeError(f"wrong world size derived: {t.sum().item()} for {world}")
        touch(os.path.join(out, rank))
        dist.destroy_process_group()
    elif mode == "kill_self":
        if attempt == "0":
            if rank == "1":
                os.kill(os.getpid(), signal.SIGKILL)
            return  # the other ranks of the first attempt are stopped at any moment
        touch(os.path.join(out, f"{rank}.{attempt}"))
    elif mode == "bipolar":
        if int(rank) % 2 == 1:
            time.sleep(1)
            raise RuntimeError(f"rank {rank} fails")
        touch(os.path.join(out, f"{rank}.{attempt}"))
    elif mode == "env":
        with open(os.path.join(out, f"{rank}.env"), "w") as f:
            for name in args:
                f.write(f"{name}={os.environ.get(name, '<unset>')}\n")
    elif mode == "error_file":
        if rank == "0":
            with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                f.write(args[0])
            sys.exit(1)
    elif mode == "drift":
        time.sleep(float(args[0]) * int(os.environ["GROUP_RANK"]))
        touch(os.path.join(out, rank))
    elif mode == "rpc":
        import torch.distributed.rpc as rpc
        role = os.environ["ROLE_NAME"]
        rpc.init_rpc(role, rank=int(rank), world_size=int(os.environ["WORLD_SIZE"]))
        if role == "master":
            answer = rpc.rpc_sync("worker", echo, args=(args[0],))
            with open(os.path.join(out, "master"), "w") as f:
                f.write(answer)
        rpc.shutdown()
    else:
        raise SystemExit(f"elastic_worker: no mode {mode}")


if __name__ == "__main__":
    main(sys.argv)
