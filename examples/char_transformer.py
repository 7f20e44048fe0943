"""A character-level causal transformer for pathkernel's sequence data sets.

    python3 examples/char_transformer.py data DATA_DIR --text FILE [--length T] [--train N] [--test N]
    python3 examples/char_transformer.py export MODEL.pt --vocab V [--length T] [--width D] [--seed S]

`data` cuts a text into windows of T + 1 characters and writes the npy:DIR
data set pathkernel reads (docs/cli.md, "Sequence data sets"): train_x.npy and
test_x.npy, int64 [n, T], the character ids of each window's first T
characters; train_y.npy and test_y.npy, int64 [n, T], the next character at
every position; vocabulary.json, each id's character, which explain uses to
show a sequence's text.

`export` writes, with torch.jit.script, a one-block causal transformer (token
and position embeddings, single-head causal self-attention, LayerNorm, a GELU
MLP, residual sums) mapping ids [n, T] to logits [n, T, V], in float64.
"""
import argparse
import json
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, length: int, width: int = 16, hidden: int = 32):
        super().__init__()
        self.width = width
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(0.1 * torch.randn(length, width))
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.lnf = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        h = self.tok(x) + self.pos[:T]
        q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.width)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        attention = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        h = h + self.proj(attention @ v)
        h = h + self.fc2(F.gelu(self.fc1(self.ln2(h))))
        return self.head(self.lnf(h))


def windows(ids, length, count, start):
    """`count` windows of length + 1 ids, every `length` // 2 ids from `start`."""
    step = max(1, length // 2)
    rows = [ids[start + i * step: start + i * step + length + 1] for i in range(count)]
    if len(rows[-1]) < length + 1:
        raise SystemExit(f"the text is too short for {count} windows of {length + 1} characters")
    w = np.array(rows, dtype=np.int64)
    return w[:, :-1], w[:, 1:]


def write_data(args):
    text = open(args.text, encoding="utf-8").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = [index[c] for c in text]
    os.makedirs(args.dir, exist_ok=True)
    train_x, train_y = windows(ids, args.length, args.train, 0)
    # The test windows come from the end of the text, after the training windows.
    test_start = len(ids) - (args.test + 1) * max(1, args.length // 2) - args.length - 1
    if test_start < args.train * max(1, args.length // 2) + args.length:
        raise SystemExit("the text is too short for the training and test windows asked for")
    test_x, test_y = windows(ids, args.length, args.test, test_start)
    for name, a in [("train_x", train_x), ("train_y", train_y), ("test_x", test_x), ("test_y", test_y)]:
        np.save(os.path.join(args.dir, name + ".npy"), a)
    with open(os.path.join(args.dir, "vocabulary.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    print(json.dumps({"dir": args.dir, "vocabulary": len(vocab), "train": train_x.shape[0],
                      "test": test_x.shape[0], "length": args.length}))


def export(args):
    torch.manual_seed(args.seed)
    model = CharTransformer(args.vocab, args.length, args.width, 2 * args.width).double()
    torch.jit.script(model).save(args.path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data", help="write a character data set as npy:DIR")
    d.add_argument("dir")
    d.add_argument("--text", required=True, help="a UTF-8 text, e.g. /usr/share/common-licenses/GPL-3")
    d.add_argument("--length", type=int, default=16, help="positions per sequence, T")
    d.add_argument("--train", type=int, default=256, help="training sequences")
    d.add_argument("--test", type=int, default=32, help="test sequences")
    e = sub.add_parser("export", help="write the transformer as a TorchScript module")
    e.add_argument("path")
    e.add_argument("--vocab", type=int, required=True, help="V: token ids and outputs")
    e.add_argument("--length", type=int, default=16, help="the longest sequence, T")
    e.add_argument("--width", type=int, default=16, help="the model width (the MLP has twice as many units)")
    e.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    write_data(args) if args.command == "data" else export(args)


if __name__ == "__main__":
    main()
