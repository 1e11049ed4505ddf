"""Module rows of a profile (`tuner profile`): which of a model's aten calls belong to one
module or function the tool can put a kernel in place of, marked as profiler ranges while the
model runs (`ModuleRanges`), and what such a module costs at best (`meta_cost`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arg:
    """One argument of a recorded call: a tensor (shape, dtype) or a scalar value."""

    shape: tuple[int, ...] | None = None  # None: not a tensor
    dtype: str | None = None  # fp32, bf16, int64 ... of a tensor
    value: Any = None  # a scalar argument's value (None also for an omitted optional)

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


class ModuleRanges:
    """The submodules `runtime.patch` would replace (its module routes' probe), each call of
    one marked as a profiler range "tuner.module::<name>" while profiling: the aten ops the
    module's forward runs for its op (an RMSNorm's cast, pow, mean, rsqrt and muls) are one
    row, "module::<op>" at the op's shapes, which the library's op matches; what the route
    leaves to torch (a gated MLP's projections) stays rows of its own. The same for the
    model's own functions the patch takes over (`routes.model_functions`: transformers'
    apply_rotary_pos_emb), wrapped while profiling, a range per distinct call signature.
    And every extractable module (`tuner.serve.extracted.recipe`: a leaf without buffers, a
    GELU written as a formula) not inside one of those: a call of it whose range holds two or
    more of the model's aten ops is one row, "class::<its name>" at its inputs' shapes (one
    op's call stays that op's row, which a library op may match)."""

    PREFIX = "tuner.module::"

    def __init__(self, model):
        import functools
        import inspect

        from tuner.serve.routes import MODULE_KEEPS, model_functions, module_ops
        self.ops = module_ops(model)
        self.keeps = MODULE_KEEPS
        self.args: dict[str, tuple[Arg, ...]] = {}
        self._open: list = []
        self._hooks = []
        self._swapped: list[tuple[Any, str, Any]] = []  # (Python module, name, its own function)
        for name, (op, module) in self.ops.items():
            self._hooks.append(module.register_forward_pre_hook(functools.partial(self._enter, name, op)))
            self._hooks.append(module.register_forward_hook(self._exit))
        for pymod, fname, op in model_functions(model):
            own = vars(pymod)[fname]
            self._swapped.append((pymod, fname, own))
            setattr(pymod, fname, self._ranged(f"{pymod.__name__}.{fname}", op, own))
        from tuner.serve.extracted import recipe, short_name
        self.recipes: dict[str, dict] = {}  # "class::<name>" -> recipe
        self.costs: dict[tuple, tuple[float, float] | None] = {}  # row key -> (FLOPs, bytes out and of parameters)
        self._costed: dict[tuple, tuple] = {}  # row key -> (module, [(shape, dtype)]): costed once profiling is over
        self._children: dict[int, int] = {}  # id of a class:: range event -> the model's aten ops in it
        routed = tuple(n + "." for n in self.ops)
        for name, module in model.named_modules():
            if not name or name in self.ops or name.startswith(routed):
                continue  # the model itself, or what a library route computes whole
            r = recipe(module)
            if r is None:
                continue
            r["shapes"] = {n: list(p.shape) for n, p in module.named_parameters(recurse=False)}  # for emit
            try:  # for the problem file's reader (a person, or a model writing the kernel)
                r["source"] = inspect.getsource(type(module))
            except (OSError, TypeError):
                pass
            row = "class::" + short_name(r)
            while row in self.recipes and self.recipes[row] != r:
                row += "'"  # another class of the same name
            self.recipes[row] = r
            self._hooks.append(module.register_forward_pre_hook(functools.partial(self._enter_class, name, row),
                                                                with_kwargs=True))
            self._hooks.append(module.register_forward_hook(self._exit_class))

    def _ranged(self, fname: str, op: str, own):
        import torch

        def call(*args, **kwargs):
            from tuner.serve.calls import dtype_of
            from tuner.serve.routes import rope_call
            found = rope_call(args, kwargs) if op == "rope" else None
            if found is None:
                return own(*args, **kwargs)
            q, k, _, _ = found
            b, _, s, d = q.shape
            dt = dtype_of(q)
            key = (Arg((b * s, q.shape[1], d), dt), Arg((b * s, k.shape[1], d), dt), Arg((b * s, d // 2), dt),
                   Arg((b * s, d // 2), dt))
            name = next((n for n, a in self.args.items() if n.startswith(fname + "#") and a == key), None)
            if name is None:
                name = f"{fname}#{sum(n.startswith(fname + '#') for n in self.args)}"
                self.args[name], self.ops[name] = key, (op, None)
            with torch.autograd.profiler.record_function(self.PREFIX + name):
                return own(*args, **kwargs)
        call.__wrapped__ = own
        return call

    def _enter(self, name: str, op: str, module, args) -> None:
        import math

        import torch

        from tuner.serve.calls import dtype_of
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dim() >= 1:
            rows, dt = math.prod(x.shape[:-1]), dtype_of(x)
            if op == "swiglu":
                n = module.gate_proj.out_features
                self.args[name] = (Arg((rows, n), dt), Arg((rows, n), dt))
            else:
                params = [module.weight] + ([module.bias] if op == "layernorm" else [])
                self.args[name] = (Arg((rows, x.shape[-1]), dt), *(Arg(tuple(p.shape), dt) for p in params))
        r = torch.autograd.profiler.record_function(self.PREFIX + name)
        r.__enter__()
        self._open.append(r)

    def _exit(self, module, args, out) -> None:
        if self._open:
            self._open.pop().__exit__(None, None, None)

    def _enter_class(self, name: str, row: str, module, args, kwargs) -> None:
        import torch

        from tuner.serve.calls import dtype_of
        r = None
        if not kwargs and args and all(isinstance(x, torch.Tensor) and dtype_of(x) for x in args):
            key = tuple(Arg(tuple(x.shape), dtype_of(x)) for x in args)
            rname = next((n for n, a in self.args.items() if n.startswith(name + "#") and a == key), None)
            if rname is None:
                rname = f"{name}#{sum(n.startswith(name + '#') for n in self.args)}"
                self.args[rname], self.ops[rname] = key, (row, None)
                self._costed.setdefault((row, key), (module, [(tuple(x.shape), x.dtype) for x in args]))
            r = torch.autograd.profiler.record_function(self.PREFIX + rname)
            r.__enter__()
        self._open.append(r)  # None: a call not extracted (keywords, or not all floating tensors)

    def _exit_class(self, module, args, out) -> None:
        if self._open:
            r = self._open.pop()
            if r is not None:
                r.__exit__(None, None, None)

    def count(self, top_level) -> None:
        """Count the model's aten ops in each class:: range (before `row_of` and `absorbing`)."""
        for e in top_level:
            p = e.cpu_parent
            while p is not None:
                if p.name.startswith(self.PREFIX):
                    self._children[id(p)] = self._children.get(id(p), 0) + 1
                    break
                p = p.cpu_parent

    def row_of(self, event) -> tuple | None:
        """The row key of a module range's event (a class:: range only when it holds two or more
        aten ops), or None for any other event."""
        key = self.key(event.name)
        if key is not None and key[0].startswith("class::") and self._children.get(id(event), 0) < 2:
            return None
        return key

    def remove(self) -> None:
        """Take the hooks off, then cost the modules extracted whole (their forwards on meta
        tensors: run while profiling, they would be calls of their own)."""
        for h in self._hooks:
            h.remove()
        for key, (module, shapes) in self._costed.items():
            self.costs[key] = meta_cost(module, shapes)
        for pymod, fname, own in reversed(self._swapped):
            setattr(pymod, fname, own)

    def key(self, event_name: str) -> tuple | None:
        """The row key of a module range's event, or None for any other event."""
        if not event_name.startswith(self.PREFIX):
            return None
        name = event_name[len(self.PREFIX):]
        if name not in self.ops or name not in self.args:
            return None
        op = self.ops[name][0]
        return (op if op.startswith("class::") else f"module::{op}", self.args[name])

    def absorbing(self, event) -> tuple | None:
        """The module row an aten event belongs to (it ran inside a routed module's range and is
        not what the route leaves to torch), or None."""
        p = event.cpu_parent
        while p is not None:
            key = self.key(p.name)
            if key is not None:
                if key[0].startswith("class::"):
                    return self.row_of(p)
                return None if event.name in self.keeps.get(self.ops[p.name[len(self.PREFIX):]][0], ()) else key
            p = p.cpu_parent
        return None


def meta_cost(module, shapes: list[tuple]) -> tuple[float, float] | None:
    """(FLOPs torch counts, bytes of the outputs and the parameters) of `module` on inputs of
    `shapes` ((shape, dtype) each), run on meta tensors (nothing computed), or None where it
    cannot run there."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    try:
        params = {n: torch.empty_like(p, device="meta") for n, p in module.named_parameters(recurse=False)}
        metas = tuple(torch.empty(shape, dtype=dt, device="meta") for shape, dt in shapes)
        with FlopCounterMode(display=False) as counter:
            out = torch.func.functional_call(module, params, metas)
    except Exception:  # noqa: BLE001 - a forward that needs data: bytes of its input's shape, as before
        return None
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
    moved = sum(float(t.numel()) * t.element_size() for t in outs + list(params.values()))
    return float(counter.get_total_flops()), moved
