#!/usr/bin/env python3
"""Export your own PyTorch model for pathkernel.

pathkernel trains, records and decomposes any module saved as TorchScript:

    scripted = torch.jit.script(model)      # or torch.jit.trace(model, example_inputs)
    scripted.save("model.pt")

and then

    pathkernel train --model torchscript:model.pt --data ... --out runs/mine

The module maps a batch of inputs [n, *input_shape] to logits [n, K]. It is
trained from the weights it was saved with. What to keep in mind:

- Write the forward pass so that it creates tensors like its inputs or
  weights (torch.zeros_like, x.new_zeros, or no new tensors at all):
  pathkernel runs the module in float64, and a float32 constant would round.
- BatchNorm1d/BatchNorm2d in training mode: save it in training mode.
  pathkernel trains with the batch statistics, tests in eval mode with the
  running statistics, and decomposes exactly (docs/math.md §15). It refuses
  track_running_stats=False and SyncBatchNorm in training mode.
- Dropout (nn.Dropout, F.dropout): save it in training mode for it to act;
  pathkernel draws its masks itself, seeded by the step, the dropout site
  and the example's input, so that replay and the decomposition draw them
  again. Dropout2d and AlphaDropout are refused in training mode.

This script exports four examples:

    python3 examples/export_model.py resnet model.pt [--channels 1 --size 28 --classes 10]
        a residual CNN with average pooling, for image data such as fashion-mnist
    python3 examples/export_model.py resnet-bn model.pt [--channels 1 --size 28 --classes 10]
        the same with BatchNorm2d (training mode) after each convolution
    python3 examples/export_model.py transformer model.pt --data-dir DIR [--p 23]
        a one-layer transformer (embedding, attention, layer norm, GELU MLP) for
        modular addition: tokens "a b =", label (a + b) mod p. --data-dir also
        writes the task as DIR/{train,test}_{x,y}.npy for --data npy:DIR.
    python3 examples/export_model.py mlp model.pt --inputs 100 --hidden 64 --classes 3
        the same network as pathkernel's own --model mlp:64 (for comparing routes)
    python3 examples/export_model.py conv1d model.pt --data-dir DIR [--length 16 --classes 3]
        a 1-D CNN (Conv1d, ReLU, MaxPool1d, Linear) for sequences [channels, length]:
        noisy waves whose class is their frequency. --data-dir also writes the
        task as DIR/{train,test}_{x,y}.npy for --data npy:DIR.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(x))), then ReLU."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class ResidualCNN(nn.Module):
    """A small residual CNN with average pooling."""

    def __init__(self, channels: int = 1, size: int = 28, width: int = 4, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(channels, width, 3, padding=1)
        self.block = ResidualBlock(width)
        self.pool = nn.AvgPool2d(4)
        self.head = nn.Linear(width * (size // 4) * (size // 4), classes)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = self.pool(self.block(h))
        return self.head(torch.flatten(h, 1))


class BatchNormBlock(nn.Module):
    """x + bn(conv(relu(bn(conv(x))))), then ReLU."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class BatchNormResidualCNN(nn.Module):
    """ResidualCNN with BatchNorm2d after each convolution, kept in training mode."""

    def __init__(self, channels: int = 1, size: int = 28, width: int = 4, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(channels, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.block = BatchNormBlock(width)
        self.pool = nn.AvgPool2d(4)
        self.head = nn.Linear(width * (size // 4) * (size // 4), classes)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = self.pool(self.block(h))
        return self.head(torch.flatten(h, 1))


class TinyTransformer(nn.Module):
    """One pre-norm transformer layer over a short token sequence; the logits
    are read at the last position."""

    def __init__(self, vocab: int, classes: int, length: int = 3, dim: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(0.02 * torch.randn(length, dim))
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp_in = nn.Linear(dim, 4 * dim)
        self.mlp_out = nn.Linear(4 * dim, dim)
        self.norm_out = nn.LayerNorm(dim)
        self.readout = nn.Linear(dim, classes)

    def forward(self, tokens):
        n, length = tokens.shape
        h = self.embed(tokens) + self.position
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        d = q.shape[-1] // self.heads
        q = q.reshape(n, length, self.heads, d).transpose(1, 2)
        k = k.reshape(n, length, self.heads, d).transpose(1, 2)
        v = v.reshape(n, length, self.heads, d).transpose(1, 2)
        attention = torch.softmax(q @ k.transpose(-2, -1) / (d ** 0.5), dim=-1)
        h = h + self.proj((attention @ v).transpose(1, 2).reshape(n, length, -1))
        h = h + self.mlp_out(F.gelu(self.mlp_in(self.norm2(h))))
        return self.readout(self.norm_out(h[:, -1]))


class MLP(nn.Module):
    """pathkernel's own mlp:H (fc1, ReLU, out), written in PyTorch."""

    def __init__(self, inputs: int, hidden: int, classes: int):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(F.relu(self.fc1(torch.flatten(x, 1))))


class Conv1dNet(nn.Module):
    """Conv1d, ReLU, MaxPool1d, Linear over sequences [channels, length]."""

    def __init__(self, channels: int, length: int, width: int, classes: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, width, 3, padding=1)
        self.pool = nn.MaxPool1d(2)
        self.out = nn.Linear(width * (length // 2), classes)

    def forward(self, x):
        return self.out(torch.flatten(self.pool(F.relu(self.conv(x))), 1))


def waves(classes: int, length: int, train: int, test: int, seed: int):
    """Sequences [1, length]: a sine of frequency k + 1 (k the class) with a
    random phase and amplitude, plus noise."""
    rng = np.random.default_rng(seed)
    n = train + test
    y = rng.integers(0, classes, n)
    phase = rng.uniform(0, 2 * np.pi, n)
    amplitude = rng.uniform(0.5, 1.5, n)
    t = np.arange(length) / length
    x = amplitude[:, None] * np.sin(2 * np.pi * (y[:, None] + 1) * t[None, :] + phase[:, None])
    x = (x + 0.3 * rng.standard_normal((n, length)))[:, None, :]
    return x[:train], y[:train].astype(np.int64), x[train:], y[train:].astype(np.int64)


def modular_addition(p: int, train_fraction: float, seed: int):
    """All pairs (a, b) as tokens [a, b, p] ("=" is token p), labels (a+b) mod p,
    split at random into train and test."""
    a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    x = np.stack([a.ravel(), b.ravel(), np.full(p * p, p)], axis=1).astype(np.int64)
    y = ((a + b) % p).ravel().astype(np.int64)
    order = np.random.default_rng(seed).permutation(p * p)
    cut = int(round(train_fraction * p * p))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=["resnet", "resnet-bn", "transformer", "mlp", "conv1d"])
    parser.add_argument("path", help="where to save the TorchScript module")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed")
    parser.add_argument("--channels", type=int, default=1, help="resnet: input channels")
    parser.add_argument("--size", type=int, default=28, help="resnet: input height and width")
    parser.add_argument("--width", type=int, default=4, help="resnet, conv1d: channels of the hidden layers")
    parser.add_argument("--classes", type=int, default=10, help="resnet, mlp, conv1d: classes")
    parser.add_argument("--length", type=int, default=16, help="conv1d: sequence length")
    parser.add_argument("--inputs", type=int, default=784, help="mlp: input features")
    parser.add_argument("--hidden", type=int, default=64, help="mlp: hidden width")
    parser.add_argument("--p", type=int, default=23, help="transformer: the modulus")
    parser.add_argument("--dim", type=int, default=32, help="transformer: model width")
    parser.add_argument("--data-dir", help="transformer, conv1d: also write the task's data here")
    parser.add_argument("--train-fraction", type=float, default=0.6, help="transformer: share of pairs to train on")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.model == "resnet":
        model = ResidualCNN(args.channels, args.size, args.width, args.classes)
    elif args.model == "resnet-bn":
        model = BatchNormResidualCNN(args.channels, args.size, args.width, args.classes)
    elif args.model == "mlp":
        model = MLP(args.inputs, args.hidden, args.classes)
    elif args.model == "conv1d":
        model = Conv1dNet(1, args.length, args.width, args.classes)
    else:
        model = TinyTransformer(vocab=args.p + 1, classes=args.p, dim=args.dim)
    torch.jit.script(model).save(args.path)
    print(f"saved {args.model} ({sum(p.numel() for p in model.parameters())} parameters) to {args.path}")

    if args.data_dir:
        os.makedirs(args.data_dir, exist_ok=True)
        if args.model == "conv1d":
            arrays = waves(args.classes, args.length, 300, 50, args.seed)
            task = f"waves of {args.classes} frequencies, length {args.length}"
        else:
            arrays = modular_addition(args.p, args.train_fraction, args.seed)
            task = f"modular addition mod {args.p}"
        for name, array in zip(["train_x", "train_y", "test_x", "test_y"], arrays):
            np.save(os.path.join(args.data_dir, name + ".npy"), array)
        print(f"wrote {task} ({len(arrays[0])} train, {len(arrays[2])} test) to {args.data_dir}")


if __name__ == "__main__":
    main()
