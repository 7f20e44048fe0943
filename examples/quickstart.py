"""Quick start: your own PyTorch loop, recorded, explained, and drawn.

A small CNN learns Fashion-MNIST in an ordinary PyTorch loop; three lines
record it (marked below); pathkernel.explain splits the network's prediction
on a test image exactly into one contribution per training image; the
figure shows the test image beside the training images that pushed its
prediction most towards its class (proponents) and most away (opponents).

    make deps && make          # Fashion-MNIST, matplotlib, build/pathkernel
    PYTHONPATH=python /usr/bin/python3 examples/quickstart.py runs/quickstart

writes the run to runs/quickstart, its explanation to runs/quickstart/explain
and the figure to runs/quickstart/quickstart.png.
"""
import argparse
import gzip
import os

import matplotlib
matplotlib.use("Agg")  # write files, no window
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pathkernel
from pathkernel.record import Recorder, set_threads

# The engine: $PATHKERNEL_BIN, else this checkout's build/pathkernel, else pathkernel on PATH.
BUILT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "build", "pathkernel")
if "PATHKERNEL_BIN" not in os.environ and os.path.isfile(BUILT):
    os.environ["PATHKERNEL_BIN"] = os.path.normpath(BUILT)

CLASSES = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def fashion_mnist(split, n):
    """The first n images of a split as float32 [n, 1, 28, 28] in [0, 1], and their labels."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(FASHION_MNIST, prefix + "-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[:n]
    with gzip.open(os.path.join(FASHION_MNIST, prefix + "-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    return torch.tensor(images / np.float32(255)), torch.tensor(labels, dtype=torch.long)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, stride=2)   # 28x28 -> 12x12
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)  # 12x12 -> 5x5
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def train(run, train_x, train_y, test_x, test_y, epochs, batch):
    """Your training loop, with the recorder's three lines."""
    torch.manual_seed(0)
    set_threads(1)  # torch and OpenBLAS on one thread: pathkernel replays the loop beside its own work
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    rec = Recorder(run, model, optimizer, train_x, train_y, test_x=test_x, test_y=test_y,  # 1
                   overwrite=True)
    for epoch in range(epochs):
        for idx in torch.randperm(len(train_x)).split(batch):
            optimizer.zero_grad()
            F.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            optimizer.step()
            rec.step(idx)                                                                 # 2
    rec.close()                                                                           # 3
    accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(f"recorded {rec.steps} steps to {run}: test accuracy {accuracy:.3f}")


def draw(ex, test_index, train_x, test_x, test_y, path, k):
    """The test image, then its top k proponents (top row) and opponents (bottom row)."""
    fig, axes = plt.subplots(2, k + 1, figsize=(1.6 * (k + 1), 4.4))
    for ax in axes.flat:
        ax.axis("off")
    predicted = int(ex.predicted[0])
    axes[0, 0].imshow(test_x[test_index, 0], cmap="gray_r")
    axes[0, 0].set_title(f"test {test_index}\n{CLASSES[int(test_y[test_index])]}\n"
                         f"predicted: {CLASSES[predicted]}", fontsize=8)
    for row, (name, points) in enumerate((("proponent", ex.top_proponents(test_index, k)),
                                          ("opponent", ex.top_opponents(test_index, k)))):
        for col, p in enumerate(points, start=1):
            axes[row, col].imshow(train_x[p["index"], 0], cmap="gray_r")
            axes[row, col].set_title(f"{name}\n{CLASSES[p['label']]}\n{p['value']:+.3g}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="the run directory to write")
    p.add_argument("--train", type=int, default=2000, help="training images")
    p.add_argument("--test", type=int, default=100, help="test images")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--test-index", type=int, default=0, help="the test image to explain")
    p.add_argument("--top", type=int, default=5, help="proponents and opponents to draw")
    a = p.parse_args()

    train_x, train_y = fashion_mnist("train", a.train)
    test_x, test_y = fashion_mnist("test", a.test)
    train(a.run, train_x, train_y, test_x, test_y, a.epochs, a.batch)

    # The network's prediction on the test image, split exactly into one
    # contribution per training image (pathkernel's engine, build/pathkernel).
    ex = pathkernel.explain(a.run, test_index=[a.test_index], top=a.top)
    print(f"contributions {list(ex.contributions.shape)} (test points, training images, classes)")
    figure = os.path.join(a.run, "quickstart.png")
    draw(ex, a.test_index, train_x, test_x, test_y, figure, a.top)
    print(f"figure: {figure}")


if __name__ == "__main__":
    main()
