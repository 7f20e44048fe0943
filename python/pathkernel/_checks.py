"""What the recorder checks before it records: the model, the optimizer, the
data and the TorchScript module (``check_record``, which returns a
:class:`RecordSpec`), and each step's batch, learning rate, hyper-parameters
and gradients. Every check raises RecorderError where it fails, naming what
is wrong, the value and what was expected."""
import math
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ._errors import RecorderError
from .dropout import graph_sites

LOSSES = ("cross_entropy", "nll", "mse")

SUPPORTED_OPTIMIZERS = (
    "torch.optim.SGD (momentum 0: 'sgd'; momentum > 0: 'momentum', with dampening; nesterov=True: "
    "'nesterov'), torch.optim.Adam ('adam'), torch.optim.AdamW ('adamw'), torch.optim.RMSprop "
    "('rmsprop', plain or centered, with momentum) and torch.optim.Adagrad ('adagrad'), with weight decay, "
    "one set of hyper-parameters for all parameters, amsgrad, maximize, capturable, differentiable "
    "and fused off")

# The optimizers whose state counts its steps (pathkernel stores the count with the buffers).
COUNTING_OPTIMIZERS = ("adam", "adamw", "rmsprop", "adagrad")

_NORM_NAMES = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d",
               "LazyBatchNorm2d", "LazyBatchNorm3d"}
_DROPOUT_NAMES = {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"}

# (name, module, why): a submodule that must stay in eval mode, why "batch"
# (BatchNorm) or "dropout" (a dropout kind pathkernel cannot draw).
Coupling = Tuple[str, torch.nn.Module, str]


@dataclass
class OptimizerSpec:
    """The optimizer as recorded: ``declaration`` is manifest.json's
    optimizer entry (the fields src/train/optimizer.cpp writes), ``hyper``
    the group hyper-parameters but the learning rate, which must not change."""
    declaration: Dict[str, Any]
    hyper: Dict[str, Any]

    @property
    def kind(self) -> str:
        return self.declaration["name"]

    @property
    def buffer_names(self) -> List[str]:
        """The optimizer's state buffers pathkernel stores, one [P] each."""
        if self.kind == "sgd":
            return []
        if self.kind in ("momentum", "nesterov"):
            return ["momentum_buffer"]
        if self.kind == "rmsprop":
            names = ["square_avg", "grad_avg"] if self.declaration["centered"] else ["square_avg"]
            return names + (["momentum_buffer"] if self.declaration.get("momentum", 0) else [])
        if self.kind == "adagrad":
            return ["sum"]
        return ["exp_avg", "exp_avg_sq"]


@dataclass
class DataSpec:
    """The checked data: inputs [n, *input_shape] (float32/float64, or int64
    codes), class labels int64 [n] or targets float64 [n, K]."""
    x: torch.Tensor
    y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    integer_inputs: bool
    num_classes: int
    train_crc32: int  # of the data as pathkernel loads it (training_data_crc32)
    sequence_length: int = 0  # T of a sequence data set (tokens y [n, T], outputs [n, T, V]), else 0

    @property
    def num_train(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_x.shape[0])


@dataclass
class RecordSpec:
    """What a Recorder records and how, once every check has passed.
    ``names`` and ``params`` are in the TorchScript module's order, the flat
    order of the run's weight vectors."""
    loss: str
    output: str
    dtype: torch.dtype
    names: List[str]
    params: List[torch.nn.Parameter]
    script: torch.jit.ScriptModule
    optimizer: OptimizerSpec
    data: DataSpec
    coupling: List[Coupling]
    modes: List[bool]  # each coupling module's training mode, as the saved TorchScript keeps it
    dropout_sites: int

    @property
    def batch_statistics(self) -> bool:
        """Whether a BatchNorm trains with batch statistics: the run then
        stores the module's buffers μ at every checkpoint."""
        return any(why == "batch" and mode for (_, _, why), mode in zip(self.coupling, self.modes))

    @property
    def dtype_name(self) -> str:
        return "float64" if self.dtype == torch.float64 else "float32"

    @property
    def shapes(self) -> List[Tuple[int, ...]]:
        return [tuple(p.shape) for p in self.params]

    @property
    def parameter_count(self) -> int:
        return int(sum(p.numel() for p in self.params))


def check_record(model: Any, optimizer: Any, train_x: Any, train_y: Any, test_x: Any, test_y: Any, loss: str,
                 output: Optional[str], script: Any) -> RecordSpec:
    """Checks a Recorder's arguments, in the order a user would fix them."""
    output = check_loss_output(loss, output)
    if not isinstance(model, torch.nn.Module):
        raise RecorderError(f"model must be a torch.nn.Module (got {type(model).__name__})")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise RecorderError(f"optimizer must be a torch.optim.Optimizer (got {type(optimizer).__name__}); "
                            f"supported: {SUPPORTED_OPTIMIZERS}")
    named = list(model.named_parameters())
    dtype = check_parameters(named)
    coupling = coupling_modules(model)
    check_modes(coupling, "the model")
    optimizer_spec = optimizer_declaration(optimizer)
    check_optimizer_parameters(optimizer, named)
    x, y, xt, yt = (as_tensor(a, what) for a, what in ((train_x, "train_x"), (train_y, "train_y"),
                                                       (test_x, "test_x"), (test_y, "test_y")))
    x, xt, integer_inputs = check_inputs(x, xt, yt is None)
    script = script_module(model, script)
    names = check_script_parameters(script, named)
    by_name = dict(named)
    num_classes, T = probe_outputs(model, script, x, loss, dtype)
    y = check_targets(y, x, "train", num_classes, loss, T)
    if yt is None:
        empty = (0, num_classes) if loss == "mse" else (0, T) if T else (0,)
        yt = torch.zeros(empty, dtype=torch.float64 if loss == "mse" else torch.int64)
    else:
        yt = check_targets(yt, xt, "test", num_classes, loss, T)
    sites = check_dropout_sites(script, model)
    data = DataSpec(x, y, xt, yt, integer_inputs, num_classes, training_crc32(x, y, dtype), T)
    return RecordSpec(loss, output, dtype, names, [by_name[n] for n in names], script, optimizer_spec, data,
                      coupling, training_modes(coupling), sites)


def check_loss_output(loss: str, output: Optional[str]) -> str:
    """The output pathkernel explains for ``loss`` (``output`` or its default)."""
    if loss not in LOSSES:
        raise RecorderError(f"loss '{loss}' is not supported; expected one of {', '.join(LOSSES)}")
    if output is None:
        output = "logsoftmax" if loss == "cross_entropy" else "logits"
    if output not in ("logsoftmax", "logits"):
        raise RecorderError(f"output '{output}' is not supported; expected 'logsoftmax' or 'logits'")
    if loss != "cross_entropy" and output != "logits":
        raise RecorderError(f"output '{output}' applies to loss cross_entropy only; loss '{loss}' explains the "
                            f"model's outputs as they are (output 'logits')")
    return output


def check_parameters(named: List[Tuple[str, torch.nn.Parameter]]) -> torch.dtype:
    """The model's one parameter dtype (float32 or float64); all on the CPU."""
    if not named:
        raise RecorderError("the model has no parameters")
    dtypes = {p.dtype for _, p in named}
    if len(dtypes) > 1:
        raise RecorderError(f"the model mixes parameter dtypes ({', '.join(sorted(str(d) for d in dtypes))}); "
                            f"pathkernel needs one dtype, float32 or float64 (call model.double() or model.float())")
    dtype = dtypes.pop()
    if dtype not in (torch.float32, torch.float64):
        raise RecorderError(f"the model's parameters are {dtype}; pathkernel records float32 or float64 models")
    for name, p in named:
        if p.device.type != "cpu":
            raise RecorderError(f"parameter '{name}' is on {p.device}; record on the CPU (pathkernel's engine runs "
                                f"on the CPU and decomposes the path exactly only with the same floating-point "
                                f"kernels)")
    return dtype


def _kind_name(module: torch.nn.Module) -> str:
    if isinstance(module, torch.jit.ScriptModule):
        return getattr(module, "original_name", type(module).__name__)
    return type(module).__name__


def coupling_modules(model: torch.nn.Module) -> List[Coupling]:
    """The submodules that must stay in eval mode."""
    out = []
    for name, m in model.named_modules():
        kind = _kind_name(m)
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) or kind in _NORM_NAMES:
            out.append((name or kind, m, "batch"))
        elif isinstance(m, torch.nn.modules.dropout._DropoutNd) or kind in _DROPOUT_NAMES:
            p = getattr(m, "p", 1.0)
            if p > 0 and kind != "Dropout":
                out.append((name or kind, m, "dropout"))
    return out


def training_modes(coupling: List[Coupling]) -> List[bool]:
    """The training mode of each coupling module (what the saved TorchScript
    keeps)."""
    return [bool(m.training) for _, m, _ in coupling]


def check_modes(coupling: List[Coupling], when: str, modes: Optional[List[bool]] = None) -> None:
    """Refuses a BatchNorm whose test outputs pathkernel cannot evaluate
    (no running statistics, or SyncBatchNorm in training mode), one whose
    mode is not ``modes`` (those when the recorder was created, which the
    saved TorchScript keeps), and an active dropout whose masks pathkernel
    cannot draw; ``when`` starts the message."""
    for i, (name, m, why) in enumerate(coupling):
        if why == "batch":
            check_batch_norm(name, m, when)
            if modes is not None and bool(m.training) != modes[i]:
                was, now = ("training", "eval") if modes[i] else ("eval", "training")
                raise RecorderError(
                    f"{when}: the BatchNorm '{name}' is in {now} mode, but it was in {was} mode when the Recorder "
                    f"was created, which the saved TorchScript keeps; pathkernel replays each step in that mode. "
                    f"Train in the mode the model had then (model.train() after evaluating)")
        if why == "dropout" and m.training:
            raise RecorderError(
                f"{when}: '{name}' is an active {_kind_name(m)}: pathkernel draws the masks of nn.Dropout and "
                f"F.dropout itself, seeded per step and example, and cannot draw this kind's (channel or alpha "
                f"dropout) again, so the steps could not be decomposed. Use nn.Dropout, or call .eval() on it "
                f"(or set p=0)")


def check_batch_norm(name: str, m: torch.nn.Module, when: str) -> None:
    """A BatchNorm pathkernel decomposes: one that keeps running statistics
    (in training mode the engine follows their moves, docs/math.md §15), and
    in training mode not a SyncBatchNorm."""
    kind = _kind_name(m)
    tracks = getattr(m, "track_running_stats", True)
    if not tracks or getattr(m, "running_mean", None) is None:
        raise RecorderError(
            f"{when}: the BatchNorm '{name}' ({kind}) has track_running_stats={tracks!r} and no running "
            f"statistics, expected track_running_stats=True: without them it normalises a test input by the "
            f"statistics of whatever it is evaluated with, so a test output is not a function of that input alone. "
            f"Use track_running_stats=True (the default), or LayerNorm/GroupNorm")
    if m.training and "Sync" in kind:
        raise RecorderError(
            f"{when}: the BatchNorm '{name}' is a {kind} in training mode: its batch statistics are gathered across "
            f"processes pathkernel does not see, expected nn.BatchNorm1d/2d/3d. Build the model with "
            f"nn.BatchNorm1d/2d, or call .eval() on it")


def _training_batch_norms(coupling: List[Coupling]) -> List[Tuple[str, torch.nn.Module]]:
    """The BatchNorm modules in training mode that count their batches."""
    return [(name, m) for name, m, why in coupling
            if why == "batch" and m.training and getattr(m, "num_batches_tracked", None) is not None]


def batch_counts(coupling: List[Coupling]) -> List[int]:
    """num_batches_tracked of each BatchNorm in training mode (its batches
    seen in training-mode forwards)."""
    return [int(m.num_batches_tracked) for _, m in _training_batch_norms(coupling)]


def check_batch_counts(coupling: List[Coupling], before: List[int], s: int) -> List[int]:
    """Each BatchNorm in training mode saw exactly one batch in step ``s``:
    pathkernel's step is one training-mode forward of the whole batch, which
    moves the running statistics once. Returns the counts now."""
    after = batch_counts(coupling)
    for (name, _), b, a in zip(_training_batch_norms(coupling), before, after):
        if a - b != 1:
            raise RecorderError(
                f"step {s}: the BatchNorm '{name}' saw {a - b} training-mode forward(s) in the step "
                f"(num_batches_tracked {b} -> {a}), expected 1: pathkernel's step is one training-mode forward of "
                f"the whole batch (its statistics and one move of the running statistics). Do not split the step's "
                f"batch (gradient accumulation), and evaluate in eval mode (model.eval(), then model.train())")
    return after


def hyper_parameters(optimizer: torch.optim.Optimizer, group: Dict[str, Any]) -> Dict[str, Any]:
    """A parameter group's hyper-parameters but the learning rate (the keys of
    the optimizer's defaults; schedulers' own keys such as initial_lr or
    max_lr are not the optimizer's)."""
    return {k: group.get(k) for k in optimizer.defaults if k not in ("params", "lr")}


def _check_one_group(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """Group 0's hyper-parameters, refusing other groups that differ."""
    groups = optimizer.param_groups
    first = hyper_parameters(optimizer, groups[0])
    for i, g in enumerate(groups[1:], start=1):
        other = hyper_parameters(optimizer, g)
        if other != first or g["lr"] != groups[0]["lr"]:
            diff = sorted(k for k in set(first) | set(other) | {"lr"}
                          if (g.get(k) if k != "lr" else g["lr"]) != (groups[0].get(k) if k != "lr" else groups[0]["lr"]))
            raise RecorderError(f"optimizer parameter group {i} has hyper-parameters ({', '.join(diff)}) that "
                                f"differ from group 0; pathkernel records one set of hyper-parameters for all "
                                f"parameters (supported: {SUPPORTED_OPTIMIZERS})")
    return first


def optimizer_declaration(optimizer: torch.optim.Optimizer) -> OptimizerSpec:
    """manifest.json's optimizer entry and the hyper-parameters that must not
    change, for torch's SGD, Adam, AdamW, RMSprop and Adagrad."""
    cls = type(optimizer)
    if cls not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.Adagrad):
        raise RecorderError(f"optimizer {cls.__module__}.{cls.__name__} is not supported; supported: "
                            f"{SUPPORTED_OPTIMIZERS}")
    first = _check_one_group(optimizer)
    g = optimizer.param_groups[0]
    for flag in ("amsgrad", "maximize", "capturable", "differentiable", "fused"):
        if g.get(flag, False):
            raise RecorderError(f"optimizer {cls.__name__} with {flag}=True is not supported; supported: "
                                f"{SUPPORTED_OPTIMIZERS}")
    lr = float(g.get("initial_lr", g["lr"]))
    if not (math.isfinite(lr) and lr > 0):
        raise RecorderError(f"optimizer learning rate must be > 0 (got {lr!r})")
    wd = float(g.get("weight_decay", 0.0))
    if not (wd >= 0):
        raise RecorderError(f"optimizer weight_decay must be >= 0 (got {wd!r})")
    if cls is torch.optim.SGD:
        return OptimizerSpec(_sgd_declaration(g, lr, wd), first)
    eps = float(g["eps"])
    if not (eps > 0):
        raise RecorderError(f"{cls.__name__} eps must be > 0 (got {eps!r})")
    if cls is torch.optim.RMSprop:
        return OptimizerSpec(_rmsprop_declaration(g, lr, wd, eps), first)
    if cls is torch.optim.Adagrad:
        return OptimizerSpec(_adagrad_declaration(g, lr, wd, eps), first)
    beta1, beta2 = (float(b) for b in g["betas"])
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        raise RecorderError(f"Adam betas must be in [0, 1) (got {g['betas']!r})")
    decl = {"name": "adam" if cls is torch.optim.Adam else "adamw", "lr": lr, "beta1": beta1, "beta2": beta2,
            "eps": eps, "weight_decay": wd}
    return OptimizerSpec(decl, first)


def _sgd_declaration(g: Dict[str, Any], lr: float, wd: float) -> Dict[str, Any]:
    momentum, dampening, nesterov = float(g["momentum"]), float(g["dampening"]), bool(g["nesterov"])
    if momentum == 0:
        return {"name": "sgd", "lr": lr, "weight_decay": wd}
    if not (0 < momentum < 1):
        raise RecorderError(f"SGD momentum must be in (0, 1) (got {momentum!r})")
    if not (0 <= dampening < 1):
        raise RecorderError(f"SGD dampening must be in [0, 1) (got {dampening!r})")
    return {"name": "nesterov" if nesterov else "momentum", "lr": lr, "momentum": momentum, "dampening": dampening,
            "weight_decay": wd}


def _rmsprop_declaration(g: Dict[str, Any], lr: float, wd: float, eps: float) -> Dict[str, Any]:
    alpha, momentum = float(g["alpha"]), float(g["momentum"])
    if not (0 <= momentum < 1):
        raise RecorderError(f"RMSprop momentum must be in [0, 1) (got {momentum!r})")
    if not (0 <= alpha < 1):
        raise RecorderError(f"RMSprop alpha must be in [0, 1) (got {alpha!r})")
    decl = {"name": "rmsprop", "lr": lr, "alpha": alpha, "centered": bool(g["centered"])}
    if momentum != 0:  # as src/train/optimizer.cpp writes it: absent means none
        decl["momentum"] = momentum
    decl.update({"eps": eps, "weight_decay": wd})
    return decl


def _adagrad_declaration(g: Dict[str, Any], lr: float, wd: float, eps: float) -> Dict[str, Any]:
    if g.get("foreach"):
        raise RecorderError("Adagrad with foreach=True is not supported: its multi-tensor step takes the rate in "
                            "float32 and divides after multiplying, other arithmetic than the step pathkernel "
                            "replays, so the replay would drift from the loop; use foreach=False (torch's "
                            "default on the CPU)")
    lr_decay, initial = float(g["lr_decay"]), float(g["initial_accumulator_value"])
    if not (lr_decay >= 0):
        raise RecorderError(f"Adagrad lr_decay must be >= 0 (got {lr_decay!r})")
    if not (initial >= 0):
        raise RecorderError(f"Adagrad initial_accumulator_value must be >= 0 (got {initial!r})")
    return {"name": "adagrad", "lr": lr, "lr_decay": lr_decay, "initial_accumulator_value": initial, "eps": eps,
            "weight_decay": wd}


def _fresh_state(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer has not stepped: no state, or Adagrad's as its
    constructor makes it (step 0, every sum at initial_accumulator_value)."""
    if isinstance(optimizer, torch.optim.Adagrad):
        init = float(optimizer.param_groups[0]["initial_accumulator_value"])
        return all(float(st.get("step", 0)) == 0 and bool((st["sum"] == init).all())
                   for st in optimizer.state.values() if "sum" in st)
    return not any(v is not None for st in optimizer.state.values() for v in st.values())


def check_optimizer_parameters(optimizer: torch.optim.Optimizer,
                               named: List[Tuple[str, torch.nn.Parameter]]) -> None:
    """The optimizer trains exactly the model's parameters and has not stepped."""
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    model_ids = {id(p): n for n, p in named}
    opt_ids = {id(p) for p in opt_params}
    missing = [n for n, p in named if id(p) not in opt_ids]
    if missing:
        listed = ", ".join(f"'{n}'" for n in missing[:5])
        raise RecorderError(f"the optimizer does not train parameter(s) {listed} "
                            f"of the model; pathkernel decomposes a path along which every parameter is trained "
                            f"(frozen parameters are not supported)")
    extra = [p for p in opt_params if id(p) not in model_ids]
    if extra:
        raise RecorderError(f"the optimizer trains {len(extra)} tensor(s) that are not parameters of the model; "
                            f"pass the model that owns all of the optimizer's parameters")
    if not _fresh_state(optimizer):
        raise RecorderError("the optimizer has already taken steps (its state is not empty); create the Recorder "
                            "before the first optimizer.step(), so the path starts at the model's initial weights")


def as_tensor(a: Any, what: str) -> Optional[torch.Tensor]:
    """``a`` (a tensor or array) as a contiguous CPU tensor, or None."""
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        t = a.detach()
    else:
        try:
            t = torch.from_numpy(np.ascontiguousarray(np.asarray(a)))
        except TypeError as e:
            raise RecorderError(f"{what}: cannot read it as an array ({e})") from e
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous()


def _check_input_array(x: torch.Tensor, what: str) -> Tuple[torch.Tensor, bool]:
    """Float inputs as they are, or integer codes as int64; and whether they
    are integer codes."""
    if x.dim() < 2:
        raise RecorderError(f"{what} has shape {list(x.shape)}; expected [n, *input_shape] with at least one input "
                            f"dimension")
    if x.dtype in (torch.float32, torch.float64):
        # All finite exactly when the least and the largest are (NaN propagates through both).
        if x.numel() and not all(bool(torch.isfinite(v)) for v in torch.aminmax(x)):
            raise RecorderError(f"{what} holds a value that is not finite (NaN or infinite)")
        return x, False
    if x.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        x = x.to(torch.int64)
        if x.numel() and float(x.abs().max()) >= 2.0 ** 53:
            raise RecorderError(f"{what} holds integers of magnitude >= 2^53, which float64 does not hold exactly")
        return x, True
    raise RecorderError(f"{what} has dtype {x.dtype}; expected float32/float64 inputs or integer codes such as "
                        f"token ids")


def check_inputs(x: torch.Tensor, xt: Optional[torch.Tensor],
                 no_test_y: bool) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """The training and test inputs (an empty test set when there is none),
    and whether they are integer codes."""
    if (xt is None) != no_test_y:
        raise RecorderError("give both test_x and test_y, or neither")
    x, integer_inputs = _check_input_array(x, "train_x")
    if x.shape[0] < 1:
        raise RecorderError("train_x has no rows")
    if xt is None:
        return x, x.new_empty((0,) + tuple(x.shape[1:])), integer_inputs
    xt, integer_test = _check_input_array(xt, "test_x")
    if tuple(xt.shape[1:]) != tuple(x.shape[1:]):
        raise RecorderError(f"test_x has examples of shape {list(xt.shape[1:])}, train_x {list(x.shape[1:])}; "
                            f"expected the same")
    if integer_test != integer_inputs:
        raise RecorderError(f"train_x is {x.dtype} and test_x {xt.dtype}; expected both floating point or both "
                            f"integer")
    if integer_inputs:
        xt = xt.to(torch.int64)
    elif xt.dtype != x.dtype:
        raise RecorderError(f"train_x is {x.dtype} and test_x {xt.dtype}; expected the same dtype")
    return x, xt, integer_inputs


def check_targets(y: torch.Tensor, x: torch.Tensor, what: str, K: int, loss: str, T: int = 0) -> torch.Tensor:
    """Class labels as int64 [n] in [0, K), for loss "mse" targets as
    float64 [n, K], or for a sequence model (outputs [n, T, K]) tokens as
    int64 [n, T] in [0, K)."""
    if y.dim() == 0 or y.shape[0] != x.shape[0]:
        rows = y.shape[0] if y.dim() >= 1 else "no"
        raise RecorderError(f"{what}_y has {rows} rows but {what}_x has {x.shape[0]}; expected one "
                            f"{'target' if loss == 'mse' else 'label'} per example")
    if loss == "mse":
        if y.dim() != 2 or y.shape[1] != K or y.dtype not in (torch.float32, torch.float64):
            raise RecorderError(f"loss 'mse' takes float targets of shape [n, K] = [{x.shape[0]}, {K}] (K the "
                                f"model's outputs; for class labels, F.one_hot(y, K).double()); {what}_y is "
                                f"{y.dtype} of shape {list(y.shape)}")
        if y.numel() and not bool(torch.isfinite(y).all()):
            raise RecorderError(f"{what}_y holds a target that is not finite")
        return y.to(torch.float64).contiguous()
    if T and (y.dim() != 2 or y.shape[1] != T):
        raise RecorderError(f"{what}_y has shape {list(y.shape)}, but the model outputs sequences [n, T, V] = "
                            f"[{x.shape[0]}, {T}, {K}]; expected tokens of shape [n, T] = [{x.shape[0]}, {T}] (the "
                            f"token at every position, the loss F.cross_entropy(logits.flatten(0, 1), y.flatten()))")
    if not T and y.dim() != 1:
        hint = " (use loss='mse' for targets [n, K])" if y.dim() == 2 and y.dtype.is_floating_point else \
            " (tokens [n, T] need a model whose outputs are [n, T, V])" if y.dim() == 2 else ""
        raise RecorderError(f"{what}_y has shape {list(y.shape)}; loss '{loss}' takes class labels of shape "
                            f"[n]{hint}")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise RecorderError(f"{what}_y has dtype {y.dtype}; expected integer {'tokens' if T else 'class labels'}")
    y = y.to(torch.int64)
    if y.numel():
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= K:
            raise RecorderError(f"{what}_y holds labels in [{lo}, {hi}], but the model has {K} outputs: expected "
                                f"labels in [0, {K})")
    return y.contiguous()


def check_vocabulary(vocabulary: Any, d: DataSpec) -> Optional[List[str]]:
    """The vocabulary.json a sequence data set is stored with: ``vocabulary``
    (V strings, V the model's outputs, naming every input code), or
    "<0>" .. "<V-1>" when none is given and the inputs are codes below V;
    None for other data (or float inputs, which a vocabulary cannot name)."""
    if vocabulary is None:
        if not d.sequence_length or not d.integer_inputs or _largest_code(d) >= d.num_classes:
            return None
        return [f"<{i}>" for i in range(d.num_classes)]
    if not d.sequence_length:
        raise RecorderError("vocabulary is given, but the model's outputs are not sequences [n, T, V]; a vocabulary "
                            "names a sequence model's tokens")
    if not d.integer_inputs:
        raise RecorderError("vocabulary is given, but train_x holds floats; a vocabulary names integer input codes "
                            "(token ids)")
    words = list(vocabulary) if isinstance(vocabulary, (list, tuple)) else None
    if words is None or not all(isinstance(w, str) for w in words):
        raise RecorderError(f"vocabulary must be a list of strings, one per token (got {type(vocabulary).__name__})")
    if len(words) != d.num_classes:
        raise RecorderError(f"vocabulary holds {len(words)} strings, but the model outputs V = {d.num_classes} "
                            f"tokens; expected one string per token")
    if _largest_code(d) >= len(words):
        raise RecorderError(f"train_x/test_x hold the code {_largest_code(d)}, but the vocabulary names codes 0 .. "
                            f"{len(words) - 1}; expected every input code named")
    return words


def _largest_code(d: DataSpec) -> int:
    return max(int(t.max()) for t in (d.x, d.test_x) if t.numel())


def training_crc32(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> int:
    """The CRC-32 pathkernel's reader computes (training_data_crc32) on the
    data as it loads it: the inputs converted to the run's dtype (so token
    ids and float32 inputs of a float64 model as float64), then the int64
    labels or float64 targets."""
    x_raw = memoryview(np.ascontiguousarray(x.to(dtype).numpy())).cast("B")  # no copy
    y_raw = memoryview(np.ascontiguousarray(y.numpy())).cast("B")
    return zlib.crc32(y_raw, zlib.crc32(x_raw)) & 0xFFFFFFFF


def script_module(model: torch.nn.Module, script: Any) -> torch.jit.ScriptModule:
    """The TorchScript module to save: ``script``, or the model scripted."""
    if script is None:
        if isinstance(model, torch.jit.ScriptModule):
            return model
        try:
            return torch.jit.script(model)
        except Exception as e:  # torch raises several kinds
            first = str(e).strip().splitlines()
            raise RecorderError(f"the model cannot be scripted with torch.jit.script ({type(e).__name__}: "
                                f"{first[0] if first else ''}); pathkernel runs the model as TorchScript. Make its "
                                f"forward scriptable, or pass script=torch.jit.trace(model, example_inputs) if "
                                f"tracing captures it") from e
    if not isinstance(script, torch.jit.ScriptModule):
        raise RecorderError(f"script must be a TorchScript module (torch.jit.script or torch.jit.trace), got "
                            f"{type(script).__name__}")
    return script


def check_script_parameters(script: torch.jit.ScriptModule,
                            named: List[Tuple[str, torch.nn.Parameter]]) -> List[str]:
    """The TorchScript module holds the model's parameters (names, shapes,
    values); returns their names in its order, the run's flat order."""
    snamed = list(script.named_parameters())
    shapes = [(n, tuple(p.shape)) for n, p in snamed]
    model_shapes = [(n, tuple(p.shape)) for n, p in named]
    if shapes != model_shapes and sorted(shapes) != sorted(model_shapes):
        raise RecorderError(f"the TorchScript module's parameters {[n for n, _ in snamed][:8]} are not the model's "
                            f"{[n for n, _ in named][:8]}")
    by_name = dict(named)
    for n, p in snamed:
        if p is not by_name[n] and not torch.equal(p.detach(), by_name[n].detach()):
            raise RecorderError(f"the TorchScript module's parameter '{n}' holds other values than the model's: it "
                                f"must hold the weights training starts from (trace or script the model itself)")
    return [n for n, _ in snamed]


class eval_mode:
    """Puts a module and its submodules in eval mode for a block, then gives
    each its own mode back."""

    def __init__(self, module: torch.nn.Module):
        self._module = module

    def __enter__(self) -> None:
        self._modes = [(m, m.training) for m in self._module.modules()]
        self._module.eval()

    def __exit__(self, *exc: Any) -> bool:
        for m, mode in self._modes:
            m.training = mode
        return False


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else ""


def _run_probe(model: torch.nn.Module, script: torch.jit.ScriptModule, probe: torch.Tensor) -> torch.Tensor:
    """The model's outputs [n, K] (or [n, T, V], a sequence model's) on ``probe``, checked against the
    TorchScript module's; dropout off on both sides (torch's masks are not
    the engine's)."""
    n = probe.shape[0]
    with torch.no_grad(), eval_mode(model), eval_mode(script):
        try:
            out = model(probe)
        except Exception as e:
            raise RecorderError(f"the model fails on train_x[:{n}] ({type(e).__name__}: {_first_line(e)}); check "
                                f"train_x's shape and dtype") from e
        if not isinstance(out, torch.Tensor) or out.dim() not in (2, 3) or out.shape[0] != n:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise RecorderError(f"the model maps train_x[:{n}] to {got}; expected outputs of shape [{n}, K] (or "
                                f"[{n}, T, V] for sequences)")
        if script is not model:
            try:
                sout = script(probe)
            except Exception as e:
                raise RecorderError(f"the TorchScript module fails on train_x[:{n}] ({e})") from e
            scale = max(1.0, float(out.abs().max()))
            if sout.shape != out.shape or float((sout - out).abs().max()) > 1e-5 * scale:
                diff = float((sout - out).abs().max()) if sout.shape == out.shape else float("nan")
                raise RecorderError(f"the TorchScript module's outputs on train_x[:{n}] are not the model's (max "
                                    f"difference {diff:.3g}): it does not compute what is trained (a traced module "
                                    f"keeps the mode it was traced in, e.g. a BatchNorm's training mode: script the "
                                    f"model with torch.jit.script)")
    return out


def probe_outputs(model: torch.nn.Module, script: torch.jit.ScriptModule, x: torch.Tensor, loss: str,
                  dtype: torch.dtype) -> Tuple[int, int]:
    """The model's number of outputs K (a sequence model's vocabulary V) and
    sequence length T (0: not a sequence model), from a probe batch, checked
    against the loss."""
    probe = x[: min(x.shape[0], 8)]
    out = _run_probe(model, script, probe)
    K, T = int(out.shape[-1]), int(out.shape[1]) if out.dim() == 3 else 0
    if K < 1 or out.dim() == 3 and T < 1:
        raise RecorderError(f"the model has no outputs (shape {list(out.shape)})")
    if T and loss == "mse":
        raise RecorderError(f"the model maps train_x[:{probe.shape[0]}] to sequences {list(out.shape)} ([n, T, V]), "
                            f"but loss 'mse' takes outputs [n, K]; sequences take 'cross_entropy' (mean over "
                            f"tokens, F.cross_entropy(logits.flatten(0, 1), y.flatten())) or 'nll'")
    if loss == "nll":
        lse = torch.logsumexp(out.to(torch.float64), dim=-1)
        if float(lse.abs().max()) > (1e-9 if dtype == torch.float64 else 1e-4):
            raise RecorderError(f"loss 'nll' takes log-probabilities, but the model's outputs on "
                                f"train_x[:{probe.shape[0]}] are not (logsumexp {float(lse.abs().max()):.3g}, "
                                f"expected 0): end the model in log_softmax, or use loss='cross_entropy' for logits")
    elif loss == "cross_entropy" and K < 2:
        raise RecorderError(f"loss 'cross_entropy' needs at least 2 classes; the model has {K} output")
    return K, T


def check_dropout_sites(script: torch.jit.ScriptModule, model: torch.nn.Module) -> int:
    """The dropout sites of the module's forward (pathkernel draws their
    masks, by site); refuses sites it cannot number while training."""
    sites, nested = graph_sites(script)
    if nested > 0 and model.training:
        raise RecorderError(
            f"the model's TorchScript forward has {nested} dropout site(s) inside a branch or a loop (a call of "
            f"F.dropout from a forward compiles to a branch on `inplace`); pathkernel draws dropout masks itself, "
            f"numbered by site, and numbers only the sites of the forward's own block in the order they are "
            f"called. Use nn.Dropout modules, or call .eval() on the model")
    return sites


# ------------------------------------------------------------------ each step

def flat_indices(idx: Any, n: int) -> np.ndarray:
    """A step's batch as int64 training indices in [0, n), without repeats."""
    a = idx.detach().cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)
    if a.dtype == np.bool_:
        raise RecorderError("rec.step: the batch is a boolean mask; pass the training indices of the step "
                            "(e.g. mask.nonzero().flatten())")
    if a.size == 0:
        raise RecorderError("rec.step: the batch is empty; pass the training indices the step used")
    if not np.issubdtype(a.dtype, np.integer):
        if np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            raise RecorderError(f"rec.step: the batch must be integer training indices (got dtype {a.dtype})")
    a = a.astype(np.int64).reshape(-1)
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= n:
        raise RecorderError(f"rec.step: the batch holds index {lo if lo < 0 else hi}, outside the training set "
                            f"[0, {n})")
    uniq, counts = np.unique(a, return_counts=True)
    if uniq.size != a.size:
        dup = uniq[counts > 1][:5].tolist()
        raise RecorderError(f"rec.step: the batch repeats training indices {dup}; pathkernel's loss is a mean over "
                            f"distinct training points, each weighted once (sample with replacement only across "
                            f"steps)")
    return a


def step_learning_rate(step_lrs: List[List[float]], s: int) -> float:
    """The one learning rate of the one optimizer.step() since the previous
    rec.step, taken from ``step_lrs`` (each such step's groups' rates)."""
    if len(step_lrs) == 0:
        raise RecorderError(f"rec.step (step {s}): no optimizer.step() since the previous rec.step(); call "
                            f"rec.step(idx) right after each optimizer.step()")
    if len(step_lrs) > 1:
        raise RecorderError(f"rec.step (step {s}): optimizer.step() ran {len(step_lrs)} times since the previous "
                            f"rec.step(); call rec.step(idx) after every optimizer.step()")
    lrs = step_lrs.pop()
    if any(lr != lrs[0] for lr in lrs):
        raise RecorderError(f"step {s}: the optimizer's parameter groups used different learning rates {lrs}; "
                            f"pathkernel records one learning rate per step")
    return float(lrs[0])


def check_hyper_parameters(optimizer: torch.optim.Optimizer, hyper: Dict[str, Any], s: int) -> None:
    """No hyper-parameter but the learning rate changed since the start."""
    for i, g in enumerate(optimizer.param_groups):
        now = hyper_parameters(optimizer, g)
        if now != hyper:
            changed = sorted(k for k in set(now) | set(hyper) if now.get(k) != hyper.get(k))
            values = ", ".join(f"{k}={now.get(k)!r}" for k in changed)
            raise RecorderError(f"step {s}: the optimizer's {', '.join(changed)} changed during training (group "
                                f"{i}: {values}); pathkernel records a per-step learning rate only (for OneCycleLR "
                                f"pass cycle_momentum=False)")


def check_gradients(names: Sequence[str], params: Sequence[torch.nn.Parameter], s: int) -> None:
    """Every parameter had a gradient, so torch's optimizer updated it."""
    for name, p in zip(names, params):
        if p.grad is None:
            raise RecorderError(f"step {s}: parameter '{name}' has no gradient, so torch's optimizer skipped it (no "
                                f"weight decay, no momentum); pathkernel's update rule updates every parameter. Use "
                                f"every parameter in the loss, and optimizer.zero_grad(set_to_none=False)")


def clip_factor_of_step(given: Optional[float], applied: Optional[float], s: int) -> Optional[float]:
    """The step's clip factor: ``given`` to rec.step, or the one
    clip_grad_norm_ ``applied``; both must agree."""
    if given is None:
        return applied
    given = float(given)
    if not (math.isfinite(given) and given > 0):
        raise RecorderError(f"step {s}: clip_factor must be finite and > 0 (got {given!r})")
    if applied is not None and applied != given:
        raise RecorderError(f"step {s}: clip_factor={given!r}, but clip_grad_norm_ applied {applied!r}")
    return given


def optimizer_step_count(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], s: int) -> int:
    """The optimizer's step count after step s (Adam's, AdamW's, RMSprop's,
    Adagrad's), the same for every parameter."""
    counts = set()
    for p in params:
        t = optimizer.state.get(p, {}).get("step")
        counts.add(int(float(t)) if t is not None else 0)
    if len(counts) != 1:
        raise RecorderError(f"step {s}: the optimizer's parameters have different step counts {sorted(counts)} (a "
                            f"parameter without a gradient is skipped by torch's optimizers); pathkernel needs "
                            f"every parameter updated at every step")
    step = counts.pop()
    if step != s + 1:
        raise RecorderError(f"step {s}: the optimizer's step count is {step}, expected {s + 1}; call rec.step(idx) "
                            f"once after every optimizer.step()")
    return step
