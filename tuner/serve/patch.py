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
  computes exactly stand replaced (the ops the table holds, nothing else: `TakenOver`):
  softmax over the last dim (torch.softmax, F.softmax, Tensor.softmax; no dtype argument);
  layer_norm over the last dim with weight and bias at eps 1e-5 (F.layer_norm: nn.LayerNorm);
  rms_norm over the last dim with a weight at eps 1e-6 (F.rms_norm: nn.RMSNorm); a 2-D matrix
  product (torch.mm, torch.matmul, Tensor.mm, Tensor.matmul, @); F.scaled_dot_product_attention
  at a decode step (attention_decode: one query per sequence against a KV cache, grouped heads
  where enable_gqa, no mask, not causal, scale 1/sqrt(D)). And the model's own functions that
  compute an op, found by name in the Python modules that define its classes and taken only
  when a probe agrees (`model_functions`): transformers' `apply_rotary_pos_emb(q, k, cos,
  sin)` as two rope calls (q's and k's tokens), where cos and sin repeat their angles (known
  for what a rotary embedding module a probe took returned, else checked once per pair of
  tensors: `rope_halves`). A call through a name bound before
  the forward (`from torch.nn.functional import softmax`) is torch's own. Under
  torch.compile only the last (UNDER_COMPILE_FUNCTIONS), through a torch function mode and the
  custom op: the compiler computes the others itself, fused with their neighbours. On by
  default only when the table serves an op only they reach (FUNCTION_ONLY: softmax, matmul,
  attention_decode, rope; `patch(..., functions=)`).
- A model's own modules, extracted whole by `tuner profile --emit` (`tuner.serve.extracted`):
  where the table holds a kernel tuned for such a problem file, every module of the model
  with the file's recipe (`MODULE`: the same class, the same attributes and parameter names)
  is replaced, once a probe agrees that the file's Model computes what the module does
  (`_probe_whole`); a call with positional tensors only, in eval mode, runs the kernel (on
  those, then the module's own parameters) where the table serves its sizes, else the
  module's own forward, which is also what torch.compile traces.
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
import warnings
import weakref
from collections import defaultdict
from typing import Any

from tuner.serve.calls import LIVE, SIZES, TORCH, custom_op, dtype_of, records_grad
from tuner.serve.routes import (FUNCTION_ONLY, HANDLERS, MODULE_ROUTES, UNDER_COMPILE_FUNCTIONS, RouteUnderCompile,
                                TakenOver, entry_points, model_functions, rotary_producers)

ATTR = "tuner_patch"
_IDS = itertools.count(1)


class Patched:
    """The patch of one model: what it routed (`stats`), the modules it replaced (`modules`:
    name -> op), and `undo()`."""

    def __init__(self, model, table, functions: bool | None = None, under_compile=None, ops=None):
        self.model, self.table = model, table
        named = _extracted(table)  # op -> recipe: the table's modules extracted whole
        self.under_compile = None if under_compile is None else _op_names(under_compile, also=named)
        whole = sorted((self.under_compile or set()) & set(named))
        if whole:  # accepted and then ignored would be worse than refused
            raise ValueError(f"under_compile: {', '.join(whole)} is a module extracted whole; under "
                             f"torch.compile its own forward is traced (the compiler fuses it), never "
                             f"routed: leave it out (it is routed in eager mode)")
        self.ops = None if ops is None else _op_names(ops, "ops", also=named)
        # A string, not an int: Dynamo may turn an int it saw change between compiles of one
        # code object (the routes' forwards, shared by every patch) into a symbolic value,
        # which the trace-time lookup (`_may_serve`, a constant function) cannot take.
        self.id = f"patch{next(_IDS)}"
        LIVE[self.id] = self
        self.stats: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # key -> [routed, fell back]
        self.modules: dict[str, str] = {}
        self.model_functions: dict[str, str] = {}  # "module.function" -> op: the model's own functions taken over
        self._routes: dict[tuple, Any] = {}  # call signature -> Kernel, or None: torch's own
        self._replaced: list[tuple[Any, Any]] = []  # (module, its own instance forward or None)
        self._halves: dict[tuple[int, int], tuple] = {}  # rope_halves' checked pairs
        self._made: dict[int, tuple] = {}  # id -> (weakref, version): cos and sin a rotary producer returned
        self._hooks: list = []
        # extracted op -> (the own forward of a module it replaced, its parameter count): torch's definition
        self._own: dict[str, tuple[Any, int]] = {}
        # A module is replaced only for an op the table holds at some size: a route that can
        # never serve would cost every call a trip through Python (and, under torch.compile, an
        # opaque custom op the compiler cannot fuse).
        held = table.ops() if hasattr(table, "ops") else None  # a table that lists none: every route is tried
        if self.ops is not None:
            missing = sorted(self.ops - held) if held is not None else []
            if missing:  # asked for by name and never served: said, not silently left to torch
                warnings.warn(f"ops: the table holds no kernel for {', '.join(missing)}; those calls stay "
                              f"torch's (the table has {', '.join(sorted(held)) or 'no op'})", stacklevel=3)
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
        from tuner.serve.extracted import same
        wanted = {op: r for op, r in named.items() if (held is None or op in held)}
        self.refused: dict[str, str] = {}  # extracted op -> why a module of its recipe was left alone (the probe)
        probed: dict[tuple, str] = {}  # (op, the module's parameter shapes) -> the probe's answer
        for name, module in model.named_modules():
            if not wanted or (name or "(the model)") in self.modules:
                continue
            # The ops of its recipe (one per size its parameters had when profiled): the first
            # whose probe agrees.
            op, why = None, {}
            for candidate in (o for o, r in wanted.items() if same(module, r)):
                key = (candidate, tuple(tuple(p.shape) for p in module.parameters(recurse=False)))
                if key not in probed:
                    probed[key] = _probe_whole(table, candidate, module)
                if not probed[key]:
                    op = candidate
                    break
                why[candidate] = probed[key]
            if op is None:
                self.refused.update(why)
                continue
            self._own.setdefault(op, (module.forward, len(list(module.parameters(recurse=False)))))  # its own
            self._replace(module, self._whole(op, module))
            self.modules[name or "(the model)"] = op
        if self.modules:
            custom_op()
        if functions is None:  # see `patch`
            functions = bool((held or set()) & FUNCTION_ONLY)
        self.functions = functions
        if functions:
            original = model.forward

            compiled_routes = held is None or bool(held & UNDER_COMPILE_FUNCTIONS)

            own = model_functions(model, held)
            self.model_functions = {f"{pymod.__name__}.{name}": op for pymod, name, op in own}
            if any(op == "rope" for _, _, op in own):
                self._hooks += [m.register_forward_hook(self._produced) for m in rotary_producers(model)]
            entries = entry_points(held) + tuple((pymod, name, HANDLERS[op]) for pymod, name, op in own)

            def forward(*args, **kwargs):
                import torch
                if torch.compiler.is_compiling():
                    if not compiled_routes:
                        return original(*args, **kwargs)
                    with RouteUnderCompile(self):
                        return original(*args, **kwargs)
                with TakenOver(self, entries):
                    return original(*args, **kwargs)
            self._replace(model, forward)
            custom_op()

    def _whole(self, op: str, module):
        """The forward of a module the table's `op` computes whole (an extracted module): the
        kernel takes the call's tensors, then the module's parameters (as a problem file's
        kernel takes its Model's)."""
        own = module.forward

        def forward(*args, **kwargs):
            import torch
            if kwargs or not args or module.training or torch.compiler.is_compiling() \
                    or not all(isinstance(x, torch.Tensor) for x in args):
                return own(*args, **kwargs)  # training: the file was profiled, and tuned, in eval mode
            xs = list(args) + list(module.parameters(recurse=False))
            if records_grad(*xs):
                return own(*args)
            k = self.kernel(op, xs)
            return k._launch(xs) if k is not None else own(*args)
        return forward

    def torch_of(self, op: str):
        """torch's definition of `op`, called as its kernel is: the library op's, or the own
        forward of a module an extracted op replaced (on the call's tensors; its parameters
        are its own)."""
        if op not in self._own:
            return TORCH[op]
        own, n_params = self._own[op]
        return lambda *xs: own(*xs[:len(xs) - n_params])

    def _replace(self, module, forward) -> None:
        self._replaced.append((module, module.__dict__.get("forward")))
        module.forward = forward

    def undo(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for module, own in reversed(self._replaced):
            if own is not None:
                module.forward = own
            else:
                module.__dict__.pop("forward", None)
        self._replaced.clear()
        self.model.__dict__.pop(ATTR, None)
        LIVE.pop(self.id, None)

    def served(self) -> list[tuple[str, str, list, Any, int]]:
        """Each call signature a tuned kernel served so far: (stats key, op, [(shape, dtype,
        device) per input], the kernel, calls routed)."""
        out = []
        for (op, *ins), (k, counts) in self._routes.items():
            if k is not None:
                key = next(name for name, c in self.stats.items() if c is counts)
                out.append((key, op, list(ins), k, counts[0]))
        return out

    def kernel(self, op: str, inputs: list, count: bool = True):
        """The table's kernel for this call, or None (torch's own); counted in `stats` unless
        `count` is false (a route asking before it decides). Resolved once per call signature."""
        sig = (op, *[(x.shape, x.dtype, x.device) for x in inputs])
        try:
            k, counts = self._routes[sig]
        except KeyError:
            try:
                sizes = SIZES[op](inputs) if op in SIZES else self.table.sizes_of(op, inputs)
            except LookupError:  # an extracted op's inputs that do not show its sizes: torch's own
                sizes = None
            dtype = dtype_of(inputs[0])
            k = self.table.kernel(op, sizes, dtype) if sizes and dtype and all(v > 0 for v in sizes.values()) \
                and (self.ops is None or op in self.ops) else None
            if k is not None and k.mismatch(inputs) is not None:
                k = None
            shape = sizes.values() if sizes else inputs[0].shape
            counts = self.stats[f"{op} {'x'.join(str(v) for v in shape)} {dtype}"]
            self._routes[sig] = k, counts
        if count:
            counts[0 if k is not None else 1] += 1
        return k

    def _produced(self, module, args, out) -> None:
        """A rotary producer's forward hook (`routes.rotary_producers`): its cos and sin have
        the angles repeated, by the probe that took the module."""
        import torch
        if torch.compiler.is_compiling() or not isinstance(out, (tuple, list)):
            return
        if len(self._made) >= 64:
            self._made.clear()
        for t in out:
            if isinstance(t, torch.Tensor):
                self._made[id(t)] = (weakref.ref(t), _version(t))

    def rope_halves(self, cos, sin):
        """The first halves of cos and sin as contiguous [tokens, D/2] where each one's two
        halves are equal (the rope route's condition: models repeat the angles), else None.
        Equal without a look where both came from a rotary producer unchanged; otherwise
        checked on the device (a sync: ~270 us of a 4096-token prefill layer on an H200). Either
        way remembered while both are the same live, unchanged tensors (their version counters;
        an inference tensor keeps none: its identity alone), for the model's other layers. Not
        checked while a CUDA graph is captured (the check reads data)."""
        import torch
        key, versions = (id(cos), id(sin)), (_version(cos), _version(sin))
        hit = self._halves.get(key)
        if hit is not None and hit[0]() is cos and hit[1]() is sin and hit[2] == versions:
            return hit[3]
        made = all((m := self._made.get(id(t))) is not None and m[0]() is t and m[1] == v
                   for t, v in ((cos, versions[0]), (sin, versions[1])))
        h = cos.shape[-1] // 2
        if not made and cos.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        equal = made or (torch.equal(cos[..., :h], cos[..., h:]) and torch.equal(sin[..., :h], sin[..., h:]))
        halves = (cos[..., :h].reshape(-1, h).contiguous(), sin[..., :h].reshape(-1, h).contiguous()) if equal else None
        if len(self._halves) >= 8:
            self._halves.clear()
        self._halves[key] = (weakref.ref(cos), weakref.ref(sin), versions, halves)
        return halves

    def call(self, op: str, inputs: list):
        """`op` on 2-D (rows) inputs: the tuned kernel where there is one, else the op's
        definition in torch (`TORCH`). Run with torch function handling off: under a torch
        function mode (the caller's, or the compile-time one) every tensor method the launcher
        calls would be a trip through Python."""
        import torch
        with torch._C.DisableTorchFunction():
            k = self.kernel(op, inputs)
            return k._launch(inputs) if k is not None else TORCH[op](*inputs)


def _version(t) -> int | None:
    """t's version counter (bumped by every in-place change), None for an inference tensor."""
    return None if t.is_inference() else t._version


def checked_ops(table, ops, what: str = "ops") -> frozenset:
    """`ops` checked as `patch(model, table, ops=)` checks it, before any model is loaded:
    TypeError or ValueError naming what it could be."""
    return _op_names(ops, what, also=_extracted(table))


def _op_names(ops, what: str = "under_compile", also=()) -> frozenset:
    """`under_compile` or `ops` checked: library op names the patch routes, or `also` (the
    table's extracted modules) (a typo would otherwise leave every op to the compiler, or
    torch, without a word)."""
    if isinstance(ops, str) or not all(isinstance(o, str) for o in ops):
        raise TypeError(f"{what}={ops!r}: a set of op names, e.g. {{'swiglu'}} (or () for none)")
    unknown = sorted(set(ops) - set(SIZES) - set(also))
    if unknown:
        raise ValueError(f"{what}: {', '.join(unknown)} is not an op the patch routes; "
                         f"one of {', '.join(sorted(set(SIZES) | set(also)))}")
    return frozenset(ops)


def _probe_whole(table, op: str, module) -> str:
    """Why `module` is not what the table's problem file `op` computes, or "": its own forward
    against the file's Model on the file's inputs (on the host, at the sizes tuned where their
    product is at most 2^24, else each at most 64; with the module's parameters in the Model's
    place), within the dtype's tolerance. The recipe says the class and attributes are the
    same; the probe says the file's Model is that module (a problem file's MODULE is only
    text)."""
    import math

    import torch

    from tuner.core.op import TOLERANCE
    from tuner.core.ops import load_op
    entry = next(e for e in table.entries if e["op"] == op)
    params = list(module.parameters(recurse=False))

    def run(sizes):
        ref = load_op(table._spec(entry, sizes))
        xs = list(ref.make_inputs(0))
        xs = [x.to(params[0].device) for x in xs[:len(xs) - len(params)]] if params else xs
        with torch.no_grad():  # with the module's own parameters in place of the Model's
            want = ref.torch_call(xs + params) if params and ref.torch_call else ref.torch_impl(xs)
            return module(*xs), want
    try:
        # At the sizes tuned, where that is small (and always for a module with parameters: their
        # shapes are sizes); else each size at most 64.
        tuned = dict(entry["sizes"])
        small = params or math.prod(int(v) for v in tuned.values()) <= 1 << 24
        try:
            got, want = run(tuned if small else {k: min(int(v), 64) for k, v in tuned.items()})
        except Exception:  # noqa: BLE001 - a file whose sizes do not shrink: at its own
            got, want = run(dict(entry["sizes"]))
    except Exception as e:  # noqa: BLE001 - whatever stops the probe: the module stays as it is
        return f"the probe failed: {type(e).__name__}: {str(e)[:200]}"
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    atol, rtol = TOLERANCE.get(entry["dtype"], (1e-5, 1e-5))
    if len(got) != len(want) or not all(isinstance(g, torch.Tensor) and g.shape == w.shape
                                        and torch.allclose(g.double(), w.double(), atol=atol, rtol=rtol, equal_nan=True)
                                        for g, w in zip(got, want)):
        return f"its problem file's Model ({table.source(entry)}) does not compute what the module does"
    return ""


def _extracted(table) -> dict[str, dict]:
    """op -> recipe of each problem-file op of `table` whose file is a module extracted whole
    (its `MODULE`), read once per table."""
    found = getattr(table, "_extracted_modules", None)
    if found is None:
        from tuner.serve.extracted import read
        found = {}
        for e in getattr(table, "entries", ()):
            if e.get("kind") == "kernelbench" and e["op"] not in found:
                r = read(table.source(e))
                if r is not None:
                    found[e["op"]] = r
        try:
            table._extracted_modules = found
        except AttributeError:
            pass
    return found


def patch(model, table, functions: bool | None = None, under_compile=None, ops=None):
    """Patch `model` in place (see the module docstring) and return it; a second patch
    replaces the first. `functions`: route torch function calls too (each call of a
    taken-over entry point pays the route's checks, served or not: a few microseconds);
    None: when the table serves an op only they reach (softmax, matmul, attention_decode, rope).
    `under_compile`: the library ops (e.g. {"swiglu"}) whose calls stay routed while
    torch.compile traces the model; the others are left to the compiler there and routed
    in eager mode only; None: every op. A module extracted whole is always its own forward
    under torch.compile (naming one here is refused). `ops`: the only ops routed at all (e.g. what `tuner
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
