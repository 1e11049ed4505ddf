"""A routed call, from a patched model to a tuned kernel: the library ops as the patch calls
them (their sizes read from the inputs, their output's shape, their definition in torch), the
custom op `tuner::routed` that torch.compile sees of a routed call, and the decision, taken while
the compiler traces, to leave a call to the compiler instead. `tuner.serve.routes` says which
calls are routed; `tuner.serve.patch` holds a model's patch (`Patched`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

RMS_EPS = 1e-6  # the library ops' constants (tuner.core.ops): a module at another eps is not theirs
LN_EPS = 1e-5

LIVE: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()  # patch id -> patch (the custom op's way back)


SIZES: dict[str, Callable] = {
    "softmax": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "rmsnorm": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "layernorm": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "swiglu": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "matmul": lambda xs: {"M": xs[0].shape[0], "N": xs[1].shape[1], "K": xs[0].shape[1]},
    "rope": lambda xs: {"T": xs[0].shape[0], "H": xs[0].shape[1], "D": xs[0].shape[2]},
    "attention_decode": lambda xs: {"B": xs[0].shape[0], "H": xs[0].shape[1], "KH": xs[1].shape[1],
                                    "S": xs[1].shape[2], "D": xs[0].shape[2]},
}


def _out_shape(op: str, xs: list) -> tuple:
    return (xs[0].shape[0], xs[1].shape[1]) if op == "matmul" else tuple(xs[0].shape)


def _torch_ops() -> dict[str, Callable]:
    import torch
    import torch.nn.functional as F

    def rmsnorm(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w.float()).to(x.dtype)

    def rope(x, c, s):  # x [T, H, D], c and s [T, D/2]: rotate-half in x's dtype (the library's definition)
        h = x.shape[-1] // 2
        x1, x2, c, s = x[..., :h], x[..., h:], c[:, None], s[:, None]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def attention_decode(q, k, v):
        return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=q.shape[1] != k.shape[1]).squeeze(2)
    return {"softmax": lambda x: torch.softmax(x, -1), "rmsnorm": rmsnorm,
            "layernorm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS),
            "swiglu": lambda a, b: F.silu(a) * b, "matmul": lambda a, b: a @ b,
            "rope": rope, "attention_decode": attention_decode}


class _TorchOps(dict):
    def __missing__(self, op):
        self.update(_torch_ops())
        return self[op]


TORCH: dict[str, Callable] = _TorchOps()


_CUSTOM_OP = None


def custom_op():
    """The custom op `tuner::routed(op, patch_id, inputs)`, registered once: what torch.compile
    sees of a routed module (opaque to the compiler; its fake gives the output's shape)."""
    global _CUSTOM_OP, _MAY_SERVE, _LIBRARY
    if _CUSTOM_OP is None:
        import torch
        _MAY_SERVE = torch._dynamo.assume_constant_result(_may_serve)
        lib = torch.library.Library("tuner", "DEF")
        lib.define("routed(str op, str patch_id, Tensor[] inputs) -> Tensor")
        # One kernel for every dispatch key, not `torch.library.custom_op`: that one's Python
        # autograd layer runs on every call and cost several times the dispatch itself, and a
        # routed call never records autograd (the routes leave such calls to torch's own).
        lib.impl("routed", lambda op, patch_id, inputs: LIVE[patch_id].call(op, inputs), "CompositeExplicitAutograd")
        torch.library.register_fake("tuner::routed", lambda op, patch_id, inputs: inputs[0].new_empty(_out_shape(op, inputs)),
                                    lib=lib)
        _LIBRARY = lib  # the registration lives as long as this object
        _CUSTOM_OP = torch.ops.tuner.routed.default
    return _CUSTOM_OP


_LIBRARY = None


def routed(op: str, patch_id: str, inputs: list):
    """`op` on these rows through the patch `patch_id`: the custom op when torch.compile traces
    the call, a direct call otherwise (the custom op's dispatch is host time eager need not pay)."""
    import torch
    if torch.compiler.is_compiling():
        return _CUSTOM_OP(op, patch_id, inputs)
    return LIVE[patch_id].call(op, inputs)


def left_to_compiler(op: str, patch_id: str, inputs: list) -> bool:
    """True while torch.compile traces a call the table has no kernel for, or of an op the
    patch leaves to the compiler (`under_compile`): the module's own forward is traced
    instead, so the compiler fuses it as it would unpatched. Decided once per traced shape
    (the table's lookup, nothing built); with dynamic sizes the custom op decides per call.
    Why: a fallback inside the custom op is torch's own op out of the compiler's reach,
    unfused, plus the op's dispatch (bench/RESULTS.md, the decode layer)."""
    import torch
    if not torch.compiler.is_compiling():
        return False
    sizes = SIZES[op](inputs)
    if not all(isinstance(v, int) for v in sizes.values()):
        return not _MAY_SERVE(patch_id, op, None, None)
    return not _MAY_SERVE(patch_id, op, tuple(sizes.items()), dtype_of(inputs[0]))


def _may_serve(patch_id: str, op: str, sizes: tuple | None, dtype: str | None) -> bool:
    """Whether the patch routes `op` under torch.compile and its table has an entry that can
    serve these sizes (`Table.lookup`: the rule, nothing compiled). Run by the compiler at trace
    time and taken as a constant of the traced graph (made so in `custom_op`, before any
    trace: wrapping it while tracing is a graph break). `sizes` None (dynamic sizes): whether
    the patch routes `op` under torch.compile at all, the table asked per call."""
    p = LIVE.get(patch_id)
    if p is not None and ((p.under_compile is not None and op not in p.under_compile)
                          or (p.ops is not None and op not in p.ops)):
        return False
    if sizes is None:
        return True
    lookup = getattr(p.table, "lookup", None) if p is not None else None
    if dtype is None or lookup is None:
        return p is not None and dtype is not None
    return lookup(op, dict(sizes), dtype) is not None


_MAY_SERVE = None


def records_grad(*tensors) -> bool:
    import torch
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def dtype_of(x) -> str | None:
    import torch
    return {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(x.dtype)


def rows(x):
    return x.reshape(-1, x.shape[-1]).contiguous()
