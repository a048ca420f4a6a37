"""One DistributedDataParallel training step, as an unmodified PyTorch user writes it: on Gloo,
or with BACKEND nccl on the rank's GPU (LOCAL_RANK).

    ddp_step.py OUT [BACKEND]

Writes <out>/<rank>.json: the torchrun variables this rank saw, the parameters after the step,
and an all_reduce result, so that a test can compare runs under torchrun and under launch.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

KEYS = [
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
    "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE",
]


def main():
    out = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if backend == "nccl" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
    loss = ((ddp(x.to(device)) - y.to(device)) ** 2).mean()
    loss.backward()
    opt.step()
    total = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(total)
    result = {
        "env": {k: os.environ.get(k) for k in KEYS},
        "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        "allreduce": total.item(),
        "rank": rank,
        "world": world,
    }
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
