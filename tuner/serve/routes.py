"""Which calls of a patched model are routed, and how they reach `tuner.serve.calls`:

- module routes: (patch, module) -> a replacement forward, or None when the module is not the
  op's (found by its structure, taken only when a probe agrees: see `tuner.serve.patch`);
- function routes: torch's entry points of the calls a library op computes exactly, taken over
  while a patched forward runs in eager mode (`TakenOver`), and under torch.compile the one
  torch function mode that keeps SDPA at a decode step routed (`RouteUnderCompile`);
- the model's own functions: a module-level function of the Python modules that define the
  model's classes, by a name models use for an op (transformers' `apply_rotary_pos_emb`), taken
  over the same way when a probe agrees that it computes the op (`model_functions`).
"""

from __future__ import annotations

import copy
import itertools
import threading
from typing import Any, Callable

from tuner.serve.calls import (LN_EPS, RMS_EPS, TORCH, custom_op, dtype_of, left_to_compiler, records_grad, routed,
                               rows)

Patch = Any  # a model's patch, tuner.serve.patch.Patched (that module imports this one)



# Ops that only the function routes reach (the norms have module routes too).
FUNCTION_ONLY = frozenset({"softmax", "matmul", "attention_decode", "rope"})
# Function routes kept while torch.compile traces (through the custom op, as the module
# routes): calls the compiler hands to a library kernel of its own that a tuned one can beat
# (SDPA at decode: one query against a cache). The others (softmax, the norms, a matmul) the
# compiler computes itself, fused with their neighbours.
UNDER_COMPILE_FUNCTIONS = frozenset({"attention_decode"})


# ---- module routes: (patch, module) -> a forward that routes, or None when not this op's

def _proberows(module, n: int):
    import torch
    w = next(itertools.chain(module.parameters(), [None]), None)
    if w is None or not w.is_floating_point() or w.device.type == "meta":
        return None
    g = torch.Generator(device=w.device).manual_seed(0)
    return torch.randn(8, n, generator=g, device=w.device).to(w.dtype)


def _agrees(got, want) -> bool:
    import torch

    from tuner.core.op import TOLERANCE
    atol, rtol = TOLERANCE.get(dtype_of(want) or "fp32", (1e-4, 1e-4))
    return got.shape == want.shape and bool(torch.allclose(got.double(), want.double(), atol=8 * atol, rtol=8 * rtol))


def _norm_route(p: Patch, module, op: str, eps_wanted: float, with_bias: bool):
    """An RMSNorm or LayerNorm module over the last dim at the library op's eps."""
    import torch
    w, b = getattr(module, "weight", None), getattr(module, "bias", None)
    eps = next((getattr(module, a) for a in ("variance_epsilon", "eps") if isinstance(getattr(module, a, None), float)), None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or eps is None or abs(eps - eps_wanted) > 1e-12 \
            or list(module.children()) or (with_bias != isinstance(b, torch.Tensor)) \
            or (with_bias and b.shape != w.shape):
        return None
    x = _proberows(module, w.shape[0])
    if x is None:
        return None
    own = module.forward
    params = [w, b] if with_bias else [w]
    with torch.no_grad():
        kept = [t.detach().clone() for t in params]
        try:  # the parameters randomised: a module that ignores one is told apart
            for t in params:
                t.copy_(1 + 0.5 * torch.randn_like(t))
            ok = _agrees(own(x), TORCH[op](x, *params))
        except Exception:  # noqa: BLE001 - a forward that takes other arguments is not this op
            ok = False
        finally:
            for t, k in zip(params, kept):
                t.copy_(k)
    if not ok:
        return None

    def forward(x, *args, **kwargs):
        if args or kwargs or x.shape[-1] != w.shape[0] or x.dtype != w.dtype or records_grad(x, *params):
            return own(x, *args, **kwargs)
        inputs = [rows(x), *params]
        if left_to_compiler(op, p.id, inputs):
            return own(x)
        return routed(op, p.id, inputs).reshape(x.shape)
    return forward


def _route_rmsnorm(p: Patch, module):
    return _norm_route(p, module, "rmsnorm", RMS_EPS, with_bias=False)


def _route_layernorm(p: Patch, module):
    return _norm_route(p, module, "layernorm", LN_EPS, with_bias=True)


def _route_swiglu(p: Patch, module):
    """A gated MLP: down(silu(gate(x)) * up(x)); the silu-times-up is the library's swiglu."""
    import torch
    gate, up, down, act = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
    if not all(isinstance(m, torch.nn.Module) for m in (gate, up, down)) or act is None:
        return None
    n_in = getattr(gate, "in_features", None)
    x = _proberows(module, n_in) if isinstance(n_in, int) else None
    if x is None:
        return None
    own = module.forward
    try:
        with torch.no_grad():
            ok = _agrees(own(x), down(TORCH["swiglu"](gate(x), up(x))))
    except Exception:  # noqa: BLE001 - not a gated MLP of this form
        ok = False
    if not ok:
        return None

    def forward(x, *args, **kwargs):
        if args or kwargs or records_grad(x):
            return own(x, *args, **kwargs)
        a, b = gate(x), up(x)
        if a.shape != b.shape or a.dtype != b.dtype:
            return own(x)
        inputs = [rows(a), rows(b)]
        if left_to_compiler("swiglu", p.id, inputs):
            return down(TORCH["swiglu"](a, b))
        return down(routed("swiglu", p.id, inputs).reshape(a.shape))
    return forward


MODULE_ROUTES: tuple[Callable, ...] = (_route_rmsnorm, _route_layernorm, _route_swiglu)

# What a routed module's forward computes besides its op, left to torch: the gated MLP's
# projections (a profile counts them as their own rows).
MODULE_KEEPS: dict[str, frozenset] = {"swiglu": frozenset({"aten::linear", "aten::addmm", "aten::mm", "aten::matmul"})}


def module_ops(model) -> dict[str, tuple[str, Any]]:
    """name -> (library op, module) for every submodule a module route would replace (the same
    probe as `patch`; nothing is replaced)."""
    out = {}
    for name, module in model.named_modules():
        for route in MODULE_ROUTES:
            if route(None, module) is not None:
                out[name or "(the model)"] = (route.__name__.removeprefix("_route_"), module)
                break
    return out


# ---- function routes: torch's entry points, taken over while a patched forward runs

# A patched forward's calls in eager mode reach the function routes through torch's own
# entry points (torch.softmax, F.scaled_dot_product_attention, Tensor.__matmul__, ...),
# replaced for the duration of the forward by `TakenOver`, and only those of the ops the table
# holds: a torch call the table cannot serve costs nothing. (A torch function mode, the other
# way in, costs host time on every torch call of the forward, routed or not: 3.7 us each on
# the cpu, what a launch-bound decode step feels.) A call through a name bound before the
# forward (`from torch.nn.functional import softmax`) reaches torch's own.
_ROUTING = threading.local()  # .stack: the patches whose forward runs in this thread, innermost last
_SWAP_LOCK = threading.Lock()
_SWAPPED: dict[tuple[int, str], list] = {}  # (id(owner), name) -> [owner, original, own attribute?, forwards in]


def entry_points(held) -> tuple[tuple[Any, str, Callable], ...]:
    """(owner, attribute, handler) of each torch entry point a function route takes over, for
    the ops in `held` (None: all)."""
    import torch
    import torch.nn.functional as F
    points = [(torch, "softmax", _softmax, "softmax"), (F, "softmax", _softmax, "softmax"),
              (torch.Tensor, "softmax", _softmax, "softmax"), (F, "layer_norm", _layer_norm, "layernorm"),
              (torch, "mm", _matmul, "matmul"), (torch, "matmul", _matmul, "matmul"),
              (torch.Tensor, "mm", _matmul, "matmul"), (torch.Tensor, "matmul", _matmul, "matmul"),
              (torch.Tensor, "__matmul__", _matmul, "matmul"),
              (F, "scaled_dot_product_attention", _sdpa, "attention_decode")]
    if hasattr(F, "rms_norm"):
        points.append((F, "rms_norm", _rms_norm, "rmsnorm"))
    return tuple((owner, name, handler) for owner, name, handler, op in points if held is None or op in held)


# ---- the model's own functions: module-level functions that compute a library op

# Names models give a function computing the op (the probe decides whether a function of that
# name does): transformers' Llama, Qwen, Mistral, Gemma, ... `apply_rotary_pos_emb(q, k, cos,
# sin)`, q and k [B, H, S, D], cos and sin [B, S, D].
MODEL_FUNCTIONS: dict[str, tuple[str, ...]] = {"rope": ("apply_rotary_pos_emb",)}


def model_functions(model, held=None) -> tuple[tuple[Any, str, str], ...]:
    """(Python module, attribute, op) of each function a function route takes over in `model`:
    a module-level callable of a module that defines one of the model's classes, by one of
    the op's names, that the op's probe agrees computes the op. `held`: only those ops (None: all)."""
    import sys
    out, seen = [], set()
    for m in model.modules():
        pymod = sys.modules.get(type(m).__module__)
        if pymod is None or id(pymod) in seen:
            continue
        seen.add(id(pymod))
        for op, names in MODEL_FUNCTIONS.items():
            if held is not None and op not in held:
                continue
            for name in names:
                fn = vars(pymod).get(name)
                if callable(fn) and _PROBES[op](fn):
                    out.append((pymod, name, op))
    return tuple(out)


def _rope_bhsd(t, cos, sin):
    """The library's rope (its definition, `TORCH`) of t [B, H, S, D] by cos, sin [B, S, D/2],
    in float64."""
    b, h, s, d = t.shape
    x = t.double().transpose(1, 2).reshape(b * s, h, d)
    y = TORCH["rope"](x, cos.double().reshape(b * s, d // 2), sin.double().reshape(b * s, d // 2))
    return y.view(b, s, h, d).transpose(1, 2)


def rope_call(args, kwargs):
    """(q, k, cos, sin) where a call of a model's rope function has the form the rope route
    reads (four positional tensors, nothing else: q [B, H, S, D], k [B, KH, S, D], cos and sin
    [B or 1, S, D], D even, one dtype), else None. The route's and the profile's one test."""
    import torch
    if kwargs or len(args) != 4 or not all(isinstance(t, torch.Tensor) for t in args):
        return None
    q, k, cos, sin = args
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return None
    b, _, s, d = q.shape
    if d % 2 or k.shape[0] != b or k.shape[2:] != (s, d) or cos.shape[1:] != (s, d) or cos.shape[0] not in (1, b) \
            or not (q.dtype == k.dtype == cos.dtype == sin.dtype):
        return None
    return q, k, cos, sin


def _is_rope(fn) -> bool:
    """fn(q, k, cos, sin) returns the rotate-half rope of q and of k (cos and sin [B, S, D]
    with equal halves, as models build them), on random inputs of two head counts."""
    import math

    import torch
    g = torch.Generator().manual_seed(0)
    b, h, kh, s, d = 2, 4, 2, 5, 8
    q = torch.randn(b, s, h, d, generator=g).transpose(1, 2)  # the layout a projection's view gives
    k = torch.randn(b, s, kh, d, generator=g).transpose(1, 2)
    theta = torch.rand(b, s, d // 2, generator=g) * (2 * math.pi)
    cos, sin = theta.cos(), theta.sin()
    try:
        with torch.no_grad():
            out = fn(q, k, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    except Exception:  # noqa: BLE001 - a function of that name with another signature is not the op
        return False
    return isinstance(out, (tuple, list)) and len(out) == 2 and all(
        isinstance(o, torch.Tensor) and o.shape == t.shape and bool(torch.allclose(o.double(), _rope_bhsd(t, cos, sin), atol=1e-5))
        for o, t in zip(out, (q, k)))


_PROBES: dict[str, Callable] = {"rope": _is_rope}


def rotary_producers(model) -> list:
    """The submodules that make rope's cos and sin with the angles repeated (transformers'
    rotary embeddings: a 1-D `inv_freq` buffer, forward(x, position_ids) -> (cos, sin) [B, S,
    D], D twice the buffer's length), where a probe at random positions agrees that both
    halves of each are equal. The rope route takes their outputs as such without reading them
    (`Patched.rope_halves`): a check of the data is a device sync per forward."""
    import torch
    out = []
    for m in model.modules():
        inv = getattr(m, "inv_freq", None)
        if not isinstance(inv, torch.Tensor) or inv.dim() != 1 or inv.device.type == "meta":
            continue
        g = torch.Generator().manual_seed(0)
        pos = torch.randint(0, 64, (2, 7), generator=g).to(inv.device)
        try:  # on a copy: a rotary module may update its own state from the positions it sees
            with torch.no_grad():
                got = copy.deepcopy(m)(torch.zeros(1, 1, 1, device=inv.device), pos)
        except Exception:  # noqa: BLE001 - a module of another signature is not a producer
            continue
        h = inv.shape[0]
        if isinstance(got, (tuple, list)) and len(got) == 2 and all(
                isinstance(t, torch.Tensor) and t.shape == (2, 7, 2 * h) and torch.equal(t[..., :h], t[..., h:])
                and bool(t[..., :h].std() > 0) for t in got):
            out.append(m)
    return out


def _rope(p: Patch, args, kwargs):
    """`apply_rotary_pos_emb(q, k, cos, sin)` (four positional arguments, nothing else): q
    [B, H, S, D] and k [B, KH, S, D], each a transposed view of [B, S, heads, D] (as a
    projection's output is viewed), rotated by cos and sin [B or 1, S, D], each as the
    library's rope over B*S tokens, where cos and sin have equal halves (as models build them:
    the angles repeated; `Patched.rope_halves`). The outputs are views of the same layout,
    the strides torch's elementwise ops give the function's own outputs."""
    call = rope_call(args, kwargs)
    if call is None:
        return NotImplemented
    q, k, cos, sin = call
    b, _, s, d = q.shape
    if dtype_of(q) is None or len({t.device for t in call}) != 1 or records_grad(*call):
        return NotImplemented
    if not all(t.transpose(1, 2).is_contiguous() for t in (q, k)):
        return NotImplemented  # only the layout a projection's view gives: the outputs then have eager's strides
    tokens = [t.transpose(1, 2).reshape(b * s, t.shape[1], d) for t in (q, k)]  # views, no copy
    half = cos.new_empty(()).expand(b * s, d // 2)  # the halves' shape, for the lookup (nothing copied yet)
    if not any(p.kernel("rope", [x, half, half], count=False) for x in tokens):
        return NotImplemented
    halves = p.rope_halves(cos, sin)
    if halves is None:
        return NotImplemented
    kernels = [p.kernel("rope", [x, half, half]) for x in tokens]
    c, sn = halves if cos.shape[0] == b else (halves[0].repeat(b, 1), halves[1].repeat(b, 1))
    out = []
    for t, x, kern in zip((q, k), tokens, kernels):
        inputs = [x, c, sn]
        y = kern._launch(inputs) if kern is not None else TORCH["rope"](*inputs)
        out.append(y.view(b, s, t.shape[1], d).transpose(1, 2))
    return tuple(out)


HANDLERS: dict[str, Callable] = {"rope": _rope}


def _taking_over(original: Callable, handler: Callable) -> Callable:
    """What stands at an entry point while it is taken over: the handler of the patch whose
    forward runs in this thread, else (another thread, or the handler's own torch calls)
    torch's own."""
    def entry(*args, **kwargs):
        stack = getattr(_ROUTING, "stack", None)
        if stack and stack[-1] is not None:
            p = stack[-1]
            stack.append(None)
            try:
                out = handler(p, args, kwargs)
            finally:
                stack.pop()
            if out is not NotImplemented:
                return out
        return original(*args, **kwargs)
    entry.__wrapped__ = original
    return entry


class TakenOver:
    """Within: `entries` stand replaced (counted: nested and concurrent forwards share one
    replacement, put back when the last leaves) and this thread's calls route through
    `patched`."""

    def __init__(self, patched: Patch, entries):
        self.patched, self.entries = patched, entries

    def __enter__(self):
        with _SWAP_LOCK:
            for owner, name, handler in self.entries:
                slot = _SWAPPED.get((id(owner), name))
                if slot is None:
                    own = name in vars(owner)
                    original = getattr(owner, name)
                    slot = _SWAPPED[(id(owner), name)] = [owner, original, own, 0]
                    setattr(owner, name, _taking_over(original, handler))
                slot[3] += 1
        _ROUTING.__dict__.setdefault("stack", []).append(self.patched)
        return self

    def __exit__(self, *exc):
        with _SWAP_LOCK:
            for owner, name, _ in self.entries:
                slot = _SWAPPED[(id(owner), name)]
                slot[3] -= 1
                if slot[3] == 0:
                    del _SWAPPED[(id(owner), name)]
                    if slot[2]:
                        setattr(owner, name, slot[1])
                    else:
                        delattr(owner, name)
        _ROUTING.stack.pop()
        return False


def _mode_base():
    from torch.overrides import TorchFunctionMode
    return TorchFunctionMode


class RouteUnderCompile(_mode_base()):
    """The function mode while torch.compile traces the forward: only SDPA (the one call in
    UNDER_COMPILE_FUNCTIONS), through the custom op; every other call is the compiler's. Kept
    a mode of its own so that what Dynamo inlines for each torch call of the forward is one
    identity test."""

    def __init__(self, patched: Patch):
        super().__init__()
        self.patched = patched

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch.nn.functional as F
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _sdpa(self.patched, args, kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _run(p: Patch, op: str, inputs: list):
    """The table's kernel for `op` on these inputs, or NotImplemented (torch then runs it).
    While torch.compile traces: the custom op where the table may serve the call (the op in
    UNDER_COMPILE_FUNCTIONS and the patch's `under_compile`), else NotImplemented."""
    import torch
    if torch.compiler.is_compiling():
        if op not in UNDER_COMPILE_FUNCTIONS or left_to_compiler(op, p.id, inputs):
            return NotImplemented
        return custom_op()(op, p.id, inputs)
    k = p.kernel(op, inputs)
    return NotImplemented if k is None else k._launch(inputs)


def _softmax(p: Patch, args, kwargs):
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if kwargs.get("dtype") is not None or (len(args) > 2 and args[2] is not None) or x.dim() < 1 \
            or dim not in (-1, x.dim() - 1) or dtype_of(x) is None or records_grad(x):
        return NotImplemented
    y = _run(p, "softmax", [rows(x)])
    return y if y is NotImplemented else y.reshape(x.shape)


def _layer_norm(p: Patch, args, kwargs):
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    a = dict(zip(names, args), **kwargs)
    x, shape, w, b, eps = a["input"], a.get("normalized_shape"), a.get("weight"), a.get("bias"), a.get("eps", 1e-5)
    if w is None or b is None or tuple(shape or ()) != (x.shape[-1],) or abs(eps - LN_EPS) > 1e-12 \
            or dtype_of(x) is None or records_grad(x, w, b):
        return NotImplemented
    y = _run(p, "layernorm", [rows(x), w.contiguous(), b.contiguous()])
    return y if y is NotImplemented else y.reshape(x.shape)


def _rms_norm(p: Patch, args, kwargs):
    names = ("input", "normalized_shape", "weight", "eps")
    a = dict(zip(names, args), **kwargs)
    x, shape, w, eps = a["input"], a.get("normalized_shape"), a.get("weight"), a.get("eps")
    if w is None or eps is None or tuple(shape or ()) != (x.shape[-1],) or abs(eps - RMS_EPS) > 1e-12 \
            or dtype_of(x) is None or records_grad(x, w):
        return NotImplemented
    y = _run(p, "rmsnorm", [rows(x), w.contiguous()])
    return y if y is NotImplemented else y.reshape(x.shape)


def _matmul(p: Patch, args, kwargs):
    if len(args) < 2 or kwargs:
        return NotImplemented
    a, b = args[0], args[1]
    import torch
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 2 or b.dim() != 2 \
            or a.dtype != b.dtype or dtype_of(a) is None or a.shape[1] != b.shape[0] or records_grad(a, b):
        return NotImplemented
    return _run(p, "matmul", [a.contiguous(), b.contiguous()])


def _sdpa(p: Patch, args, kwargs):
    """SDPA at a decode step (`attention_decode`): one query per sequence, [B, H, 1, D], against
    a KV cache [B, KH, S, D] (grouped heads where enable_gqa), no mask, no dropout, not causal
    (SDPA's causal mask on one query keeps key 0 alone), the scale 1/sqrt(D)."""
    import torch
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    a = dict(zip(names, args), **kwargs)
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or q.dim() != 4 or k.dim() != 4 \
            or v.shape != k.shape or a.get("attn_mask") is not None or a.get("dropout_p", 0.0) != 0 \
            or a.get("is_causal", False) or set(a) - set(names):
        return NotImplemented
    (b, h, one, d), (b2, kh, _, d2) = q.shape, k.shape
    scale = a.get("scale")
    if one != 1 or b != b2 or d != d2 or h % kh or (h != kh and not a.get("enable_gqa", False)) \
            or (scale is not None and abs(scale * d ** 0.5 - 1) > 1e-6) \
            or not (q.dtype == k.dtype == v.dtype) or dtype_of(q) is None or records_grad(q, k, v):
        return NotImplemented
    o = _run(p, "attention_decode", [q.reshape(b, h, d).contiguous(), k.contiguous(), v.contiguous()])
    return o if o is NotImplemented else o.reshape(b, h, 1, d)
