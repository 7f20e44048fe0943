"""The loss and accuracies a recorded run's metrics.csv and summary hold,
computed on the recorded weights by a copy of the saved TorchScript module in
eval mode (no dropout), as pathkernel's own training writes them."""
import io
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ._manifest import ParamInfo


def outputs_loss_and_accuracy(out: torch.Tensor, y: torch.Tensor, loss: str) -> Tuple[float, float]:
    """The declared loss (the batch mean) and the accuracy of outputs ``out``
    on targets ``y``."""
    with torch.no_grad():
        if loss == "cross_entropy":
            value = F.cross_entropy(out, y)
        elif loss == "nll":
            value = F.nll_loss(out, y)
        else:
            # Regression targets have no classes: accuracy 0, as pathkernel's
            # own training writes it (correct_predictions in loss.h).
            return float(F.mse_loss(out, y.to(out.dtype))), 0.0
        return float(value), float((out.argmax(1) == y).to(torch.float64).mean())


class Metrics:
    """``module_bytes``: the saved TorchScript module; ``layout``: the flat
    weight vector's tensors; ``loss``: cross_entropy, nll or mse."""

    def __init__(self, module_bytes: bytes, layout: List[ParamInfo], loss: str):
        self._module = torch.jit.load(io.BytesIO(module_bytes))
        self._module.eval()
        self._params = dict(self._module.named_parameters())
        self._layout = layout
        self._loss = loss

    def load(self, w: np.ndarray) -> None:
        """Sets the module's parameters to the flat weights ``w``."""
        with torch.no_grad():
            for t in self._layout:
                p = self._params[t.name]
                p.copy_(torch.from_numpy(w[t.offset:t.offset + t.numel]).reshape(t.shape).to(p.dtype))

    def batch(self, w: np.ndarray, x: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> Tuple[float, float]:
        """The declared loss and the accuracy at weights ``w`` on the training
        points ``idx``."""
        with torch.no_grad():
            self.load(w)
            index = torch.from_numpy(idx)
            return self._loss_and_accuracy(x.index_select(0, index), y.index_select(0, index))

    def _loss_and_accuracy(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, float]:
        return outputs_loss_and_accuracy(self._module(x), y, self._loss)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> Optional[float]:
        """The accuracy on (x, y) at the weights last loaded; None when there
        are no points, 0 for regression targets."""
        if x.shape[0] == 0:
            return None
        if self._loss == "mse":
            return 0.0  # regression targets have no classes (as pathkernel's training writes it)
        correct = 0
        with torch.no_grad():
            for start in range(0, x.shape[0], 1024):
                out = self._module(x[start:start + 1024])
                correct += int((out.argmax(1) == y[start:start + 1024]).sum())
        return correct / x.shape[0]
