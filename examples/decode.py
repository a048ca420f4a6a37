#!/usr/bin/env python3
"""Distributed decoding in Python with muster's channel: rank 0 gets the model (a checkpoint,
or a quick fit on a labelled TSV) and broadcasts its weights through the shared directory;
each rank classifies its share of the sentences; rank 0 gathers the predictions through the
channel and writes them in the input's order. The output is the same to the byte on any
number of ranks.

  launch --nproc_per_node=2 examples/decode.py --train data/train.tsv \
         --input data/test_unlabelled.tsv --output predictions.tsv

Input: an SST-2-style TSV with a header; the first column is the sentence (a second column
of 0/1 labels, when present, is scored). Needs PYTHONPATH to hold muster's python/ folder, or
muster installed (docs/python.md says how).
"""

import argparse
import os
import sys
import time
import zlib

import torch
from torch import nn

import muster

BUCKETS = 1 << 14


class BagOfWords(nn.Module):
    """Hashed words, averaged embeddings, a linear layer: small, and the same on every rank."""

    def __init__(self, dim=64, classes=2):
        super().__init__()
        self.embed = nn.EmbeddingBag(BUCKETS, dim, mode="mean")
        self.out = nn.Linear(dim, classes)

    def forward(self, ids, offsets):
        return self.out(torch.tanh(self.embed(ids, offsets)))


def encode(sentences):
    ids, offsets = [], []
    for s in sentences:
        offsets.append(len(ids))
        words = s.lower().split() or ["<empty>"]
        ids.extend(zlib.crc32(w.encode()) % BUCKETS for w in words)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)


def read_tsv(path):
    """(sentences, labels or None). Raises ValueError naming the file and line."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or not lines[0].startswith("sentence"):
        raise ValueError(f"{path}: line 1 is not a header starting with 'sentence'")
    sentences, labels = [], []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        sentences.append(cols[0])
        if len(cols) > 1:
            if cols[1] not in ("0", "1"):
                raise ValueError(f"{path}:{number}: label {cols[1]!r} is not 0 or 1")
            labels.append(int(cols[1]))
    if labels and len(labels) != len(sentences):
        raise ValueError(f"{path}: some lines have a label and some do not")
    return sentences, (labels or None)


def fit(model, path, epochs, batch_size):
    sentences, labels = read_tsv(path)
    if labels is None:
        raise ValueError(f"{path}: --train needs a label column")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    target = torch.tensor(labels)
    for _ in range(epochs):
        for start in range(0, len(sentences), batch_size):
            ids, offsets = encode(sentences[start:start + batch_size])
            loss = nn.functional.cross_entropy(model(ids, offsets),
                                               target[start:start + batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
            muster.progress()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="TSV of sentences to classify")
    p.add_argument("--output", required=True, help="predictions TSV, written by rank 0")
    p.add_argument("--checkpoint", help="a state dict saved with torch.save (rank 0 loads it)")
    p.add_argument("--train", help="a labelled TSV rank 0 fits the model on first")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args()
    if a.batch_size < 1 or a.epochs < 0:
        p.error("--batch-size must be >= 1 and --epochs >= 0")
    # One intra-op thread: the same arithmetic in the same order whatever the world size.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = time.monotonic()
    chan = muster.Channel()
    me, world = chan.rank, chan.world_size

    model = BagOfWords()
    if me == 0:
        if a.checkpoint:
            model.load_state_dict(torch.load(a.checkpoint, map_location="cpu"))
        elif a.train:
            fit(model, a.train, a.epochs, a.batch_size)
    # Rank 0's weights to every rank, one tensor at a time, through the shared directory.
    weights = model.state_dict()
    model.load_state_dict({k: chan.broadcast(v if me == 0 else None, 0)
                           for k, v in weights.items()})
    model.eval()

    sentences, labels = read_tsv(a.input)
    n = len(sentences)
    # Fixed global batches, dealt to the ranks in turn: every sentence is computed in the same
    # batch whatever the world size.
    index, label, prob = [], [], []
    with torch.no_grad():
        for b in range(me, (n + a.batch_size - 1) // a.batch_size, world):
            lo, hi = b * a.batch_size, min(n, (b + 1) * a.batch_size)
            best, predicted = torch.softmax(model(*encode(sentences[lo:hi])), 1).max(1)
            index.append(torch.arange(lo, hi))
            label.append(predicted)
            prob.append(best)
            muster.progress()
    cat = lambda parts, dtype: torch.cat(parts) if parts else torch.empty(0, dtype=dtype)
    mine = (cat(index, torch.int64), cat(label, torch.int64), cat(prob, torch.float32))
    # Every rank's predictions to rank 0, through the channel.
    gathered = [chan.gather(t, 0) for t in mine]
    if me != 0:
        return 0
    order = torch.cat(gathered[0])
    if sorted(order.tolist()) != list(range(n)):
        raise RuntimeError(f"the ranks' predictions do not cover the {n} sentences once each")
    lines = [None] * n
    for i, y, q in zip(order.tolist(), torch.cat(gathered[1]).tolist(),
                       torch.cat(gathered[2]).tolist()):
        lines[i] = f"{sentences[i]}\t{y}\t{q:.6f}"
    tmp = a.output + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("sentence\tprediction\tprobability\n")
        f.write("".join(line + "\n" for line in lines))
    os.replace(tmp, a.output)
    scored = ""
    if labels is not None:
        right = sum(int(line.split("\t")[1]) == y for line, y in zip(lines, labels))
        scored = f", accuracy {right / max(1, n):.3f}"
    print(f"decode.py: {n} sentences on {world} rank(s) in {time.monotonic() - start:.2f} s"
          f"{scored}; predictions in {a.output}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (muster.ChannelError, ValueError, OSError) as e:
        print(f"decode.py (rank {os.environ.get('RANK', 0)}): {e}", file=sys.stderr)
        sys.exit(1)
