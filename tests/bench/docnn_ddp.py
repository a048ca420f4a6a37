"""The same DocNN, data, tokenizer and hyper-parameters as `worker train`, in Python with
DistributedDataParallel, for the training-throughput comparison (tests/bench/train_bench.sh).

    torchrun --nproc_per_node=2 tests/bench/docnn_ddp.py DATA_DIR EPOCHS BATCH [BACKEND]
Prints "samples/s N" from rank 0: samples of all ranks per second of training, eval excluded;
then "dev accuracy A" on DATA_DIR/dev.tsv where it exists. BACKEND nccl trains on the rank's GPU
(LOCAL_RANK); the default, gloo, on the CPU.
"""
import os
import re
import sys
import time
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

TOKEN = re.compile(r"[A-Za-z0-9'\x80-\uffff]+|[^\sA-Za-z0-9'\x80-\uffff]")


def read(path):
    with open(path) as f:
        next(f)
        rows = [line.rstrip("\n").rsplit("\t", 1) for line in f if line.strip()]
    return [(s, int(l)) for s, l in rows]


class DocNN(torch.nn.Module):
    def __init__(self, vocab, embed=64, kernels=64, sizes=(3, 4, 5), dropout=0.4, classes=2):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, embed, padding_idx=0)
        self.convs = torch.nn.ModuleList(torch.nn.Conv1d(embed, kernels, k) for k in sizes)
        self.dropout = torch.nn.Dropout(dropout)
        self.fc = torch.nn.Linear(kernels * len(sizes), classes)

    def forward(self, tokens):
        x = self.embedding(tokens).transpose(1, 2)
        pooled = [F.relu(conv(x)).max(2).values for conv in self.convs]
        return self.fc(self.dropout(torch.cat(pooled, 1)))


def main():
    data_dir, epochs, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    backend = sys.argv[4] if len(sys.argv) > 4 else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    train = read(f"{data_dir}/train.tsv")
    counts = Counter(t for s, _ in train for t in TOKEN.findall(s.lower()))
    vocab = {t: i + 2 for i, (t, _) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1]))}
    length = 32

    def encode(s):
        ids = [vocab.get(t, 1) for t in TOKEN.findall(s.lower())][:length]
        return ids + [0] * (length - len(ids))

    x = torch.tensor([encode(s) for s, _ in train])
    y = torch.tensor([l for _, l in train])
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(DocNN(len(vocab) + 2).to(device),
                                    device_ids=[device.index] if backend == "nccl" else None)
    opt = torch.optim.Adam(model.parameters(), lr=0.002)
    seconds, samples = 0.0, 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
            opt.step()
            samples += len(yb) * world
        seconds += time.perf_counter() - start
    if rank == 0:
        print(f"samples/s {samples / seconds:.0f}", flush=True)
        if os.path.exists(f"{data_dir}/dev.tsv"):
            dev = read(f"{data_dir}/dev.tsv")
            model.module.eval()
            with torch.no_grad():
                xs = torch.tensor([encode(s) for s, _ in dev], device=device)
                predicted = model.module(xs).argmax(1).cpu()
            right = sum(int(p) == l for p, (_, l) in zip(predicted, dev))
            print(f"dev accuracy {right / len(dev):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
