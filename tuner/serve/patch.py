"""`runtime.patch(model, table)`: a model whose operator calls run the table's tuned kernels
where one was tuned for exactly that call, and torch's own everywhere else.

    from tuner import runtime
    table = runtime.load("exported/tuning.json")
    runtime.patch(model, table)      # in place; returns the model
    y = model(x)                     # softmax/layernorm/rmsnorm/matmul calls routed per call
    model.tuner_patch.stats          # {"softmax 16x64 fp32": [routed, fell back], ...}
    runtime.unpatch(model)           # as it was

How: the model's forward runs under a torch function mode that sees every torch function the
model calls (whatever module or line makes it) and routes, per call, the ones a library op
computes exactly:
- softmax over the last dim (torch.softmax, F.softmax, Tensor.softmax; no dtype argument);
- layer_norm over the last dim with weight and bias at eps 1e-5 (F.layer_norm: nn.LayerNorm);
- rms_norm over the last dim with a weight at eps 1e-6 (F.rms_norm: nn.RMSNorm);
- a 2-D matrix product (torch.mm, torch.matmul, Tensor.mm, @).
A call is routed when the table has a kernel for its sizes and dtype that takes these inputs
(`Table.kernel`, its lookup rule: exact sizes, or the nearest where the table allows it);
leading dims are folded into rows, non-contiguous operands copied. Anything else, and any call
that autograd records (an input requiring grad with grad enabled: the kernels compute the
forward only), runs torch's own. Not yet: torch.compile (the mode is traced as Python, the
kernels' launchers are not: compile the unpatched model, or patch after compiling).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

ATTR = "tuner_patch"


class Patched:
    """The patch of one model: what it routed (`stats`), and `undo()`."""

    def __init__(self, model, table):
        self.model, self.table = model, table
        self.stats: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [routed, fell back]
        self._own_forward = model.__dict__.get("forward")  # an instance attribute it had, if any
        original = model.forward

        def forward(*args, **kwargs):
            with _Route(self):
                return original(*args, **kwargs)
        model.forward = forward

    def undo(self) -> None:
        if self._own_forward is not None:
            self.model.forward = self._own_forward
        else:
            self.model.__dict__.pop("forward", None)
        self.model.__dict__.pop(ATTR, None)


def patch(model, table):
    """Patch `model` in place (see the module docstring) and return it; a second patch
    replaces the first."""
    if ATTR in model.__dict__:
        unpatch(model)
    model.__dict__[ATTR] = Patched(model, table)
    return model


def unpatch(model):
    """Undo `patch`; the model is as it was. A model never patched is returned as it is."""
    p = model.__dict__.get(ATTR)
    if p is not None:
        p.undo()
    return model


def _mode_base():
    from torch.overrides import TorchFunctionMode
    return TorchFunctionMode


class _Route(_mode_base()):
    def __init__(self, patched: Patched):
        super().__init__()
        self.patched = patched

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _handlers().get(func)
        if handler is not None:
            out = handler(self.patched, args, kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _records_grad(*tensors) -> bool:
    import torch
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _run(p: Patched, op: str, sizes: dict[str, int], inputs: list, dtype: str):
    """The table's kernel for `op` at `sizes` on `inputs`, or NotImplemented (torch then runs it)."""
    key = f"{op} {'x'.join(str(v) for v in sizes.values())} {dtype}"
    k = p.table.kernel(op, sizes, dtype) if all(v > 0 for v in sizes.values()) else None
    if k is None or k.mismatch(inputs) is not None:
        p.stats[key][1] += 1
        return NotImplemented
    p.stats[key][0] += 1
    return k._launch(inputs)


def _dtype(x) -> str | None:
    import torch
    return {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(x.dtype)


def _rows(x):
    return x.reshape(-1, x.shape[-1]).contiguous()


def _softmax(p: Patched, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if kwargs.get("dtype") is not None or (len(args) > 2 and args[2] is not None) or x.dim() < 1 \
            or dim not in (-1, x.dim() - 1) or _dtype(x) is None or _records_grad(x):
        return NotImplemented
    x2 = _rows(x)
    y = _run(p, "softmax", {"M": x2.shape[0], "N": x2.shape[1]}, [x2], _dtype(x))
    return y if y is NotImplemented else y.reshape(x.shape)


def _layer_norm(p: Patched, args, kwargs):
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    a = dict(zip(names, args), **kwargs)
    x, shape, w, b, eps = a["input"], a.get("normalized_shape"), a.get("weight"), a.get("bias"), a.get("eps", 1e-5)
    if w is None or b is None or tuple(shape or ()) != (x.shape[-1],) or abs(eps - 1e-5) > 1e-12 \
            or _dtype(x) is None or _records_grad(x, w, b):
        return NotImplemented
    x2 = _rows(x)
    y = _run(p, "layernorm", {"M": x2.shape[0], "N": x2.shape[1]}, [x2, w.contiguous(), b.contiguous()], _dtype(x))
    return y if y is NotImplemented else y.reshape(x.shape)


def _rms_norm(p: Patched, args, kwargs):
    names = ("input", "normalized_shape", "weight", "eps")
    a = dict(zip(names, args), **kwargs)
    x, shape, w, eps = a["input"], a.get("normalized_shape"), a.get("weight"), a.get("eps")
    if w is None or eps is None or tuple(shape or ()) != (x.shape[-1],) or abs(eps - 1e-6) > 1e-12 \
            or _dtype(x) is None or _records_grad(x, w):
        return NotImplemented
    x2 = _rows(x)
    y = _run(p, "rmsnorm", {"M": x2.shape[0], "N": x2.shape[1]}, [x2, w.contiguous()], _dtype(x))
    return y if y is NotImplemented else y.reshape(x.shape)


def _matmul(p: Patched, args, kwargs):
    if len(args) < 2 or kwargs:
        return NotImplemented
    a, b = args[0], args[1]
    import torch
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 2 or b.dim() != 2 \
            or a.dtype != b.dtype or _dtype(a) is None or a.shape[1] != b.shape[0] or _records_grad(a, b):
        return NotImplemented
    return _run(p, "matmul", {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1]},
                [a.contiguous(), b.contiguous()], _dtype(a))


_HANDLERS: dict[Any, Callable] | None = None


def _handlers() -> dict[Any, Callable]:
    global _HANDLERS
    if _HANDLERS is None:
        import torch
        import torch.nn.functional as F
        table: dict[Any, Callable] = {torch.softmax: _softmax, F.softmax: _softmax, torch.Tensor.softmax: _softmax,
                                      F.layer_norm: _layer_norm, torch.mm: _matmul, torch.matmul: _matmul,
                                      torch.Tensor.mm: _matmul, torch.Tensor.matmul: _matmul,
                                      torch.Tensor.__matmul__: _matmul}
        if hasattr(F, "rms_norm"):
            table[F.rms_norm] = _rms_norm
        _HANDLERS = table
    return _HANDLERS
