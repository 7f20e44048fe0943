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
        if loss == "mse":
            # Regression targets have no classes: accuracy 0, as pathkernel's
            # own training writes it (correct_predictions in loss.h).
            return float(F.mse_loss(out, y.to(out.dtype))), 0.0
        # A sequence's loss is the mean over its tokens (outputs [n, T, V],
        # tokens [n, T]); its accuracy that of the last position (loss.h).
        fn = F.cross_entropy if loss == "cross_entropy" else F.nll_loss
        value = fn(out.flatten(0, 1), y.flatten()) if out.dim() == 3 else fn(out, y)
        return float(value), correct(out, y) / out.shape[0]


def correct(out: torch.Tensor, y: torch.Tensor) -> int:
    """The correct predictions among outputs ``out`` [n, K] (a sequence's
    [n, T, V]: at its last position) for labels ``y``."""
    if out.dim() == 3:
        out, y = out[:, -1], y[:, -1]
    return int((out.argmax(-1) == y).sum())


class Metrics:
    """``module_bytes``: the saved TorchScript module; ``layout``: the flat
    weight vector's tensors; ``loss``: cross_entropy, nll or mse."""

    def __init__(self, module_bytes: bytes, layout: List[ParamInfo], loss: str):
        self._module = torch.jit.load(io.BytesIO(module_bytes))
        self._module.eval()
        self._params = dict(self._module.named_parameters())
        self._layout = layout
        self._loss = loss

    def load(self, w: np.ndarray, mu: Optional[np.ndarray] = None) -> None:
        """Sets the module's parameters to the flat weights ``w`` and, when
        given, its buffers to the flat ``mu`` (every buffer, in order)."""
        with torch.no_grad():
            for t in self._layout:
                p = self._params[t.name]
                p.copy_(torch.from_numpy(w[t.offset:t.offset + t.numel]).reshape(t.shape).to(p.dtype))
            offset = 0
            for b in (self._module.buffers() if mu is not None else ()):
                b.copy_(torch.from_numpy(mu[offset:offset + b.numel()]).reshape(b.shape).to(b.dtype))
                offset += b.numel()

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
        hits = 0
        with torch.no_grad():
            for start in range(0, x.shape[0], 1024):
                hits += correct(self._module(x[start:start + 1024]), y[start:start + 1024])
        return hits / x.shape[0]
