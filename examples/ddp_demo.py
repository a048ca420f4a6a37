"""A small DistributedDataParallel training job, unmodified PyTorch: what `launch` runs in the
README's demo. Synthetic data with a learnable signal (no downloads); each rank trains on its
shard; rank 0 prints loss and accuracy per epoch.

    launch --nproc_per_node=2 examples/ddp_demo.py --epochs 5
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n, w, seed):
    """Points labelled by the side of the hyperplane w they fall on."""
    x = torch.randn(n, w.numel(), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x @ w > 0).long())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises in epoch 1")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    w = torch.randn(32, generator=torch.Generator().manual_seed(1))
    train, test = make_data(4096, w, seed=2), make_data(1024, w, seed=3)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=64, sampler=sampler)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if rank == 0:
        print(f"training on {world} ranks ({os.environ.get('LOCAL_WORLD_SIZE')} per node), "
              f"store at {os.environ.get('MUSTER_STORE_ADDR', 'n/a')}", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        if epoch == 1 and rank == args.fail_rank:
            raise RuntimeError(f"rank {rank}: simulated failure in epoch {epoch}")
        model.train()
        total = torch.zeros(2)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(y), len(y)])
        dist.all_reduce(total)
        model.eval()
        with torch.no_grad():
            x, y = test.tensors
            correct = torch.tensor([(model(x).argmax(1) == y).float().mean().item()])
        dist.all_reduce(correct)
        if rank == 0:
            print(f"epoch {epoch}: train loss {total[0] / total[1]:.4f}  "
                  f"test accuracy {correct.item() / world:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
