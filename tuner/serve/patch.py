"""`runtime.patch(model, table)`: a model whose operator calls run the table's tuned kernels
where one was tuned for exactly that call, and torch's own everywhere else.

    from tuner import runtime
    table = runtime.load("exported/tuning.json")
    runtime.patch(model, table)      # in place; returns the model
    y = model(x)                     # routed per call
    model.tuner_patch.stats          # {"rmsnorm 4096x4096 bf16": [routed, fell back], ...}
    model.tuner_patch.modules        # {"layers.0.mlp": "swiglu", ...}: the modules replaced
    runtime.unpatch(model)           # as it was

Two ways in, both per call:
- Modules. At patch time every submodule is tried against the module routes: an RMSNorm
  (a 1-D `weight` and an eps of 1e-6, whatever its class), a LayerNorm (weight and bias, eps
  1e-5) and a gated MLP (`gate_proj`,
  `up_proj`, `down_proj` and a SiLU `act_fn`: down(silu(gate(x)) * up(x))). A candidate is
  replaced only when a probe agrees: the module's own forward on random rows (its weight
  randomised for the probe and put back, so a module that ignores its weight is not taken for
  one that uses it) against the library op's definition, within the dtype's tolerance. The
  replaced forward calls the op as a torch custom op (`tuner::routed`), so the patched model
  also runs under torch.compile: the kernel is opaque to the compiler, which fuses around it.
  A call the table cannot serve, or of an op not in `under_compile` (`patch(...,
  under_compile=)`: the ops routed while torch.compile traces; None: all), is traced as the
  module's own forward instead, for the compiler to fuse as it would unpatched: `tuner verify`
  says which ops pay under torch.compile.
- Functions. While the model's forward runs, torch's entry points of the calls a library op
  computes exactly stand replaced (the ops the table holds, nothing else: `_TakenOver`):
  softmax over the last dim (torch.softmax, F.softmax, Tensor.softmax; no dtype argument);
  layer_norm over the last dim with weight and bias at eps 1e-5 (F.layer_norm: nn.LayerNorm);
  rms_norm over the last dim with a weight at eps 1e-6 (F.rms_norm: nn.RMSNorm); a 2-D matrix
  product (torch.mm, torch.matmul, Tensor.mm, Tensor.matmul, @); F.scaled_dot_product_attention
  at a decode step (attention_decode: one query per sequence against a KV cache, grouped heads
  where enable_gqa, no mask, not causal, scale 1/sqrt(D)). A call through a name bound before
  the forward (`from torch.nn.functional import softmax`) is torch's own. Under
  torch.compile only the last (UNDER_COMPILE_FUNCTIONS), through a torch function mode and the
  custom op: the compiler computes the others itself, fused with their neighbours. On by
  default only when the table serves an op only they reach (FUNCTION_ONLY; `patch(...,
  functions=)`).
A call is routed when the table has a kernel for its sizes and dtype that takes these inputs
(`Table.kernel`, its lookup rule), resolved once per call signature (op, each input's shape,
dtype and device) and remembered: a routed call pays a dict lookup, not the table's rule and
the input checks. Leading dims are folded into rows, non-contiguous operands copied. Anything
else, and any call that autograd records (an input requiring grad with grad enabled: the
kernels compute the forward only), runs torch's own.
"""

from __future__ import annotations

import copy
import itertools
import threading
import weakref
from collections import defaultdict
from typing import Any, Callable

ATTR = "tuner_patch"
RMS_EPS = 1e-6  # the library ops' constants (tuner.core.ops): a module at another eps is not theirs
LN_EPS = 1e-5

_LIVE: "weakref.WeakValueDictionary[str, Patched]" = weakref.WeakValueDictionary()  # custom op -> patch
_IDS = itertools.count(1)


class Patched:
    """The patch of one model: what it routed (`stats`), the modules it replaced (`modules`:
    name -> op), and `undo()`."""

    def __init__(self, model, table, functions: bool | None = None, under_compile=None, ops=None):
        self.model, self.table = model, table
        self.under_compile = None if under_compile is None else _op_names(under_compile)
        self.ops = None if ops is None else _op_names(ops, "ops")
        # A string, not an int: Dynamo may turn an int it saw change between compiles of one
        # code object (the routes' forwards, shared by every patch) into a symbolic value,
        # which the trace-time lookup (`_may_serve`, a constant function) cannot take.
        self.id = f"patch{next(_IDS)}"
        _LIVE[self.id] = self
        self.stats: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [routed, fell back]
        self.modules: dict[str, str] = {}
        self._routes: dict[tuple, Any] = {}  # call signature -> Kernel, or None: torch's own
        self._replaced: list[tuple[Any, Any]] = []  # (module, its own instance forward or None)
        # A module is replaced only for an op the table holds at some size: a route that can
        # never serve would cost every call a trip through Python (and, under torch.compile, an
        # opaque custom op the compiler cannot fuse).
        entries = getattr(table, "entries", None)  # a table that lists none: every route is tried
        held = None if entries is None else {e["op"] for e in entries}
        if self.ops is not None:
            held = set(self.ops) if held is None else held & self.ops
        for name, module in model.named_modules():
            for route in MODULE_ROUTES:
                if held is not None and route.__name__.removeprefix("_route_") not in held:
                    continue
                forward = route(self, module)
                if forward is not None:
                    self._replace(module, forward)
                    self.modules[name or "(the model)"] = route.__name__.removeprefix("_route_")
                    break
        if self.modules:
            _custom_op()
        if functions is None:  # see `patch`
            functions = bool((held or set()) & FUNCTION_ONLY)
        self.functions = functions
        if functions:
            original = model.forward

            compiled_routes = held is None or bool(held & UNDER_COMPILE_FUNCTIONS)

            entries = _entry_points(held)

            def forward(*args, **kwargs):
                import torch
                if torch.compiler.is_compiling():
                    if not compiled_routes:
                        return original(*args, **kwargs)
                    with _RouteUnderCompile(self):
                        return original(*args, **kwargs)
                with _TakenOver(self, entries):
                    return original(*args, **kwargs)
            self._replace(model, forward)
            _custom_op()

    def _replace(self, module, forward) -> None:
        self._replaced.append((module, module.__dict__.get("forward")))
        module.forward = forward

    def undo(self) -> None:
        for module, own in reversed(self._replaced):
            if own is not None:
                module.forward = own
            else:
                module.__dict__.pop("forward", None)
        self._replaced.clear()
        self.model.__dict__.pop(ATTR, None)
        _LIVE.pop(self.id, None)

    def served(self) -> list[tuple[str, str, list, Any, int]]:
        """Each call signature a tuned kernel served so far: (stats key, op, [(shape, dtype,
        device) per input], the kernel, calls routed)."""
        out = []
        for (op, *ins), (k, counts) in self._routes.items():
            if k is not None:
                key = next(name for name, c in self.stats.items() if c is counts)
                out.append((key, op, list(ins), k, counts[0]))
        return out

    def kernel(self, op: str, inputs: list):
        """The table's kernel for this call, or None (torch's own); counted in `stats`. Resolved
        once per call signature."""
        sig = (op, *[(x.shape, x.dtype, x.device) for x in inputs])
        try:
            k, counts = self._routes[sig]
        except KeyError:
            sizes = _SIZES[op](inputs)
            dtype = _dtype(inputs[0])
            k = self.table.kernel(op, sizes, dtype) if dtype and all(v > 0 for v in sizes.values()) \
                and (self.ops is None or op in self.ops) else None
            if k is not None and k.mismatch(inputs) is not None:
                k = None
            counts = self.stats[f"{op} {'x'.join(str(v) for v in sizes.values())} {dtype}"]
            self._routes[sig] = k, counts
        counts[0 if k is not None else 1] += 1
        return k

    def call(self, op: str, inputs: list):
        """`op` on 2-D (rows) inputs: the tuned kernel where there is one, else the op's
        definition in torch (`TORCH`). Run with torch function handling off: under a torch
        function mode (the caller's, or the compile-time one) every tensor method the launcher
        calls would be a trip through Python."""
        import torch
        with torch._C.DisableTorchFunction():
            k = self.kernel(op, inputs)
            return k._launch(inputs) if k is not None else TORCH[op](*inputs)


def _op_names(ops, what: str = "under_compile") -> frozenset:
    """`under_compile` or `ops` checked: library op names the patch routes (a typo would
    otherwise leave every op to the compiler, or torch, without a word)."""
    if isinstance(ops, str) or not all(isinstance(o, str) for o in ops):
        raise TypeError(f"{what}={ops!r}: a set of op names, e.g. {{'swiglu'}} (or () for none)")
    unknown = sorted(set(ops) - set(_SIZES))
    if unknown:
        raise ValueError(f"{what}: {', '.join(unknown)} is not an op the patch routes; "
                         f"one of {', '.join(sorted(_SIZES))}")
    return frozenset(ops)


# Ops that only the function routes reach (the norms have module routes too).
FUNCTION_ONLY = frozenset({"softmax", "matmul", "attention_decode"})
# Function routes kept while torch.compile traces (through the custom op, as the module
# routes): calls the compiler hands to a library kernel of its own that a tuned one can beat
# (SDPA at decode: one query against a cache). The others (softmax, the norms, a matmul) the
# compiler computes itself, fused with their neighbours.
UNDER_COMPILE_FUNCTIONS = frozenset({"attention_decode"})


def patch(model, table, functions: bool | None = None, under_compile=None, ops=None):
    """Patch `model` in place (see the module docstring) and return it; a second patch
    replaces the first. `functions`: route torch function calls too (each call of a
    taken-over entry point pays the route's checks, served or not: a few microseconds);
    None: when the table serves an op only they reach (softmax, matmul, attention_decode).
    `under_compile`: the ops (e.g. {"swiglu"}) whose calls stay routed while torch.compile
    traces the model; the others are left to the compiler there and routed
    in eager mode only; None: every op. `ops`: the only ops routed at all (e.g. what `tuner
    verify` found pays in eager mode); None: every op the table holds."""
    if ATTR in model.__dict__:
        unpatch(model)
    model.__dict__[ATTR] = Patched(model, table, functions, under_compile, ops)
    return model


def unpatch(model):
    """Undo `patch`; the model is as it was. A model never patched is returned as it is."""
    p = model.__dict__.get(ATTR)
    if p is not None:
        p.undo()
    return model


def patched_copy(model, table, functions: bool | None = None, under_compile=None, ops=None):
    """A patched copy of `model` that shares its parameters and buffers (no second copy of the
    weights) and leaves `model` itself as it was: for timing the two side by side."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return patch(copy.deepcopy(model, shared), table, functions, under_compile, ops)


# ---- the library ops as the patch calls them: sizes, output shape, definition in torch

_SIZES: dict[str, Callable] = {
    "softmax": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "rmsnorm": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "layernorm": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "swiglu": lambda xs: {"M": xs[0].shape[0], "N": xs[0].shape[1]},
    "matmul": lambda xs: {"M": xs[0].shape[0], "N": xs[1].shape[1], "K": xs[0].shape[1]},
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

    def attention_decode(q, k, v):
        return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=q.shape[1] != k.shape[1]).squeeze(2)
    return {"softmax": lambda x: torch.softmax(x, -1), "rmsnorm": rmsnorm,
            "layernorm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS),
            "swiglu": lambda a, b: F.silu(a) * b, "matmul": lambda a, b: a @ b,
            "attention_decode": attention_decode}


class _TorchOps(dict):
    def __missing__(self, op):
        self.update(_torch_ops())
        return self[op]


TORCH: dict[str, Callable] = _TorchOps()


_CUSTOM_OP = None


def _custom_op():
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
        lib.impl("routed", lambda op, patch_id, inputs: _LIVE[patch_id].call(op, inputs), "CompositeExplicitAutograd")
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
    return _LIVE[patch_id].call(op, inputs)


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
    sizes = _SIZES[op](inputs)
    if not all(isinstance(v, int) for v in sizes.values()):
        return not _MAY_SERVE(patch_id, op, None, None)
    return not _MAY_SERVE(patch_id, op, tuple(sizes.items()), _dtype(inputs[0]))


def _may_serve(patch_id: str, op: str, sizes: tuple | None, dtype: str | None) -> bool:
    """Whether the patch routes `op` under torch.compile and its table has an entry that can
    serve these sizes (`Table.lookup`: the rule, nothing compiled). Run by the compiler at trace
    time and taken as a constant of the traced graph (made so in `_custom_op`, before any
    trace: wrapping it while tracing is a graph break). `sizes` None (dynamic sizes): whether
    the patch routes `op` under torch.compile at all, the table asked per call."""
    p = _LIVE.get(patch_id)
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


# ---- module routes: (patch, module) -> a forward that routes, or None when not this op's

def _probe_rows(module, n: int):
    import torch
    w = next(itertools.chain(module.parameters(), [None]), None)
    if w is None or not w.is_floating_point() or w.device.type == "meta":
        return None
    g = torch.Generator(device=w.device).manual_seed(0)
    return torch.randn(8, n, generator=g, device=w.device).to(w.dtype)


def _agrees(got, want) -> bool:
    import torch

    from tuner.core.op import TOLERANCE
    atol, rtol = TOLERANCE.get(_dtype(want) or "fp32", (1e-4, 1e-4))
    return got.shape == want.shape and bool(torch.allclose(got.double(), want.double(), atol=8 * atol, rtol=8 * rtol))


def _norm_route(p: Patched, module, op: str, eps_wanted: float, with_bias: bool):
    """An RMSNorm or LayerNorm module over the last dim at the library op's eps."""
    import torch
    w, b = getattr(module, "weight", None), getattr(module, "bias", None)
    eps = next((getattr(module, a) for a in ("variance_epsilon", "eps") if isinstance(getattr(module, a, None), float)), None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or eps is None or abs(eps - eps_wanted) > 1e-12 \
            or list(module.children()) or (with_bias != isinstance(b, torch.Tensor)) \
            or (with_bias and b.shape != w.shape):
        return None
    x = _probe_rows(module, w.shape[0])
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
        if args or kwargs or x.shape[-1] != w.shape[0] or x.dtype != w.dtype or _records_grad(x, *params):
            return own(x, *args, **kwargs)
        inputs = [_rows(x), *params]
        if left_to_compiler(op, p.id, inputs):
            return own(x)
        return routed(op, p.id, inputs).reshape(x.shape)
    return forward


def _route_rmsnorm(p: Patched, module):
    return _norm_route(p, module, "rmsnorm", RMS_EPS, with_bias=False)


def _route_layernorm(p: Patched, module):
    return _norm_route(p, module, "layernorm", LN_EPS, with_bias=True)


def _route_swiglu(p: Patched, module):
    """A gated MLP: down(silu(gate(x)) * up(x)); the silu-times-up is the library's swiglu."""
    import torch
    gate, up, down, act = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
    if not all(isinstance(m, torch.nn.Module) for m in (gate, up, down)) or act is None:
        return None
    n_in = getattr(gate, "in_features", None)
    x = _probe_rows(module, n_in) if isinstance(n_in, int) else None
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
        if args or kwargs or _records_grad(x):
            return own(x, *args, **kwargs)
        a, b = gate(x), up(x)
        if a.shape != b.shape or a.dtype != b.dtype:
            return own(x)
        inputs = [_rows(a), _rows(b)]
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
# replaced for the duration of the forward by `_TakenOver`, and only those of the ops the table
# holds: a torch call the table cannot serve costs nothing. (A torch function mode, the other
# way in, costs host time on every torch call of the forward, routed or not: 3.7 us each on
# the cpu, what a launch-bound decode step feels.) A call through a name bound before the
# forward (`from torch.nn.functional import softmax`) reaches torch's own.
_ROUTING = threading.local()  # .stack: the patches whose forward runs in this thread, innermost last
_SWAP_LOCK = threading.Lock()
_SWAPPED: dict[tuple[int, str], list] = {}  # (id(owner), name) -> [owner, original, own attribute?, forwards in]


def _entry_points(held) -> tuple[tuple[Any, str, Callable], ...]:
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


class _TakenOver:
    """Within: `entries` stand replaced (counted: nested and concurrent forwards share one
    replacement, put back when the last leaves) and this thread's calls route through
    `patched`."""

    def __init__(self, patched: Patched, entries):
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


class _RouteUnderCompile(_mode_base()):
    """The function mode while torch.compile traces the forward: only SDPA (the one call in
    UNDER_COMPILE_FUNCTIONS), through the custom op; every other call is the compiler's. Kept
    a mode of its own so that what Dynamo inlines for each torch call of the forward is one
    identity test."""

    def __init__(self, patched: Patched):
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


def _records_grad(*tensors) -> bool:
    import torch
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _run(p: Patched, op: str, inputs: list):
    """The table's kernel for `op` on these inputs, or NotImplemented (torch then runs it).
    While torch.compile traces: the custom op where the table may serve the call (the op in
    UNDER_COMPILE_FUNCTIONS and the patch's `under_compile`), else NotImplemented."""
    import torch
    if torch.compiler.is_compiling():
        if op not in UNDER_COMPILE_FUNCTIONS or left_to_compiler(op, p.id, inputs):
            return NotImplemented
        return _CUSTOM_OP(op, p.id, inputs)
    k = p.kernel(op, inputs)
    return NotImplemented if k is None else k._launch(inputs)


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
    y = _run(p, "softmax", [_rows(x)])
    return y if y is NotImplemented else y.reshape(x.shape)


def _layer_norm(p: Patched, args, kwargs):
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    a = dict(zip(names, args), **kwargs)
    x, shape, w, b, eps = a["input"], a.get("normalized_shape"), a.get("weight"), a.get("bias"), a.get("eps", 1e-5)
    if w is None or b is None or tuple(shape or ()) != (x.shape[-1],) or abs(eps - LN_EPS) > 1e-12 \
            or _dtype(x) is None or _records_grad(x, w, b):
        return NotImplemented
    y = _run(p, "layernorm", [_rows(x), w.contiguous(), b.contiguous()])
    return y if y is NotImplemented else y.reshape(x.shape)


def _rms_norm(p: Patched, args, kwargs):
    names = ("input", "normalized_shape", "weight", "eps")
    a = dict(zip(names, args), **kwargs)
    x, shape, w, eps = a["input"], a.get("normalized_shape"), a.get("weight"), a.get("eps")
    if w is None or eps is None or tuple(shape or ()) != (x.shape[-1],) or abs(eps - RMS_EPS) > 1e-12 \
            or _dtype(x) is None or _records_grad(x, w):
        return NotImplemented
    y = _run(p, "rmsnorm", [_rows(x), w.contiguous()])
    return y if y is NotImplemented else y.reshape(x.shape)


def _matmul(p: Patched, args, kwargs):
    if len(args) < 2 or kwargs:
        return NotImplemented
    a, b = args[0], args[1]
    import torch
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 2 or b.dim() != 2 \
            or a.dtype != b.dtype or _dtype(a) is None or a.shape[1] != b.shape[0] or _records_grad(a, b):
        return NotImplemented
    return _run(p, "matmul", [a.contiguous(), b.contiguous()])


def _sdpa(p: Patched, args, kwargs):
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
            or not (q.dtype == k.dtype == v.dtype) or _dtype(q) is None or _records_grad(q, k, v):
        return NotImplemented
    o = _run(p, "attention_decode", [q.reshape(b, h, d).contiguous(), k.contiguous(), v.contiguous()])
    return o if o is NotImplemented else o.reshape(b, h, 1, d)
