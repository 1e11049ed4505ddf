"""`tuner profile model.py`: where a model's time goes, operator by operator, and what a tuned
kernel could save there.

model.py defines the model and its example inputs, as a KernelBench problem file does
(`Model`, `get_inputs()`, `get_init_inputs()`), or a factory `get_model()` (e.g. a Hugging
Face model built from its config with random weights: nothing is downloaded) with
`get_inputs()`. The model runs under torch's profiler (on a GPU, device time; on the host,
CPU time) after a warm-up, and every operator call made directly by the model (the outermost
aten op: a Linear's addmm counts under `aten::linear`) is grouped by operator, input shapes,
dtypes and scalar arguments: one row per operator instance.

Per row: calls, total time, share of the model's time, the time the op's bytes and FLOPs take
at the device's measured ceilings (copy bandwidth, matmul rate: the bound no kernel beats),
and what a tuned kernel could save at best (Amdahl: the share times one minus bound over the
current time), and the library op with a skeleton that computes exactly this call, if any.
Nothing here claims a saving: it is an upper bound, for choosing what to tune.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tuner.core.op import OpError
from tuner.model.ranges import Arg  # noqa: F401 - a row's arguments, also imported from here

DTYPES = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
          "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
          "unsigned char": "uint8", "bool": "bool"}
_NOT_TENSOR = {"Scalar", "ScalarList", "", "TensorList", "GenericList"}


@dataclass(frozen=True)
class OpRow:
    """One operator instance: an aten op at one set of input shapes, dtypes and scalars."""

    aten: str
    args: tuple[Arg, ...]
    calls: int
    total_s: float
    share: float = 0.0
    bound_s: float | None = None  # per call, at the device's measured ceilings
    bound_what: str = ""
    saving: float | None = None  # Amdahl: the share of the model's time a perfect kernel saves
    library: tuple[str, str, str] | None = None  # (op, shape, dtype) of the library op that matches
    flops: float | None = None
    bytes: float | None = None

    @property
    def per_call_s(self) -> float:
        return self.total_s / max(self.calls, 1)

    @property
    def shapes(self) -> str:
        return ", ".join("x".join(map(str, a.shape)) or "scalar" for a in self.args if a.is_tensor)

    @property
    def dtypes(self) -> str:
        return ",".join(sorted({a.dtype for a in self.args if a.is_tensor and a.dtype}))


@dataclass(frozen=True)
class Profile:
    model: str
    device: str
    dtype: str | None
    iterations: int
    total_s: float  # per iteration, all top-level ops
    rows: tuple[OpRow, ...] = field(default_factory=tuple)
    peaks: tuple[tuple[str, float], ...] = ()
    # "class::<name>" rows (a model's own module, extracted whole: tuner.serve.extracted) -> the
    # module's recipe as JSON
    recipes: tuple[tuple[str, str], ...] = ()

    def recipe(self, row: "OpRow") -> dict | None:
        import json
        return next((json.loads(r) for name, r in self.recipes if name == row.aten), None)


# ---- loading the model --------------------------------------------------------------------

def load_model(path: str | Path):
    """(model, inputs) from a model file (see the module docstring); OpError on a file that
    does not define them, with what to add."""
    path = Path(path)
    if not path.is_file():
        raise OpError(f"{path}: no such file")
    name = f"tuner_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Kept in sys.modules: torch.compile looks a traced function's module up by name.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the file's own error, named
        sys.modules.pop(name, None)
        raise OpError(f"{path}: failed to import: {type(e).__name__}: {e}") from None
    if not hasattr(module, "get_inputs"):
        raise OpError(f"{path}: defines no get_inputs(); it must return the model's example inputs "
                      f"(a list of tensors)")
    try:
        if hasattr(module, "get_model"):
            model = module.get_model()
        elif hasattr(module, "Model"):
            init = module.get_init_inputs() if hasattr(module, "get_init_inputs") else []
            model = module.Model(*init)
        else:
            raise OpError(f"{path}: defines neither Model (with get_init_inputs()) nor get_model()")
        inputs = module.get_inputs()
    except OpError:
        raise
    except Exception as e:  # noqa: BLE001
        raise OpError(f"{path}: building the model or its inputs failed: {type(e).__name__}: {e}") from None
    if not isinstance(inputs, (list, tuple)):
        raise OpError(f"{path}: get_inputs() returned a {type(inputs).__name__}; it must return a list")
    return model, list(inputs)


def _prepared(model, inputs: list, device: str, dtype: str | None):
    import torch

    from tuner.core.op import torch_dtype
    model = model.eval().to(device)
    dt = torch_dtype(dtype) if dtype else None
    if dt is not None:
        model = model.to(dt)

    def move(x):
        if isinstance(x, torch.Tensor):
            x = x.to(device)
            return x.to(dt) if dt is not None and x.is_floating_point() else x
        return x
    return model, [move(x) for x in inputs]


# ---- profiling ----------------------------------------------------------------------------

def _kineto_dtypes(prof) -> dict[tuple[str, int], list[str]]:
    """(name, start in ns from the trace's start) -> the input dtypes, from the profiler's raw
    events: a FunctionEvent has them itself only from torch 2.12 on (torch 2.11 records them
    but does not copy them over)."""
    try:
        result = prof.profiler.kineto_results
        start = result.trace_start_ns()
        return {(k.name(), int(k.start_ns() - start)): list(k.dtypes()) for k in result.events()}
    except Exception:  # noqa: BLE001 - an older or other profiler: shapes only
        return {}


def _args_of(event, raw_dtypes: dict | None = None) -> tuple[Arg, ...]:
    shapes = list(getattr(event, "input_shapes", None) or [])
    dtypes = list(getattr(event, "input_dtypes", None) or [])
    if not dtypes and raw_dtypes:
        dtypes = raw_dtypes.get((event.name, int(round(event.time_range.start * 1000))), [])
    concrete = list(getattr(event, "concrete_inputs", None) or [])
    out = []
    for i, shape in enumerate(shapes):
        dt = dtypes[i] if i < len(dtypes) else ""
        if dt not in _NOT_TENSOR and dt is not None:
            out.append(Arg(tuple(int(s) for s in shape), DTYPES.get(dt, dt)))
        else:
            v = concrete[i] if i < len(concrete) else None
            out.append(Arg(value=tuple(v) if isinstance(v, list) else v))
    return tuple(out)


def _top_level(events) -> list:
    """The aten ops the model called itself: none of their ancestors is an aten op."""
    out = []
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        p, nested = e.cpu_parent, False
        while p is not None:
            if p.name.startswith("aten::"):
                nested = True
                break
            p = p.cpu_parent
        if not nested:
            out.append(e)
    return out


def profile_model(path: str | Path, device: str = "cpu", dtype: str | None = None, iterations: int = 5,
                  warmup: int = 2, peaks: dict[str, float] | None = None) -> Profile:
    """Run the model in `path` under torch's profiler on `device` (cpu, cuda, npu) and group
    its time by operator instance (see the module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model, inputs = load_model(path)
    if device == "cuda" and not torch.cuda.is_available():
        raise OpError("--device cuda: torch sees no CUDA device here")
    if device == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise OpError("--device npu needs torch_npu (and CANN)") from None
    model, inputs = _prepared(model, inputs, device, dtype)
    sync = {"cuda": lambda: torch.cuda.synchronize(), "npu": lambda: torch.npu.synchronize()}.get(device, lambda: None)
    with torch.no_grad():
        try:
            for _ in range(warmup):
                model(*inputs)
        except Exception as e:  # noqa: BLE001 - the model's own error
            raise OpError(f"{path}: the model failed on its inputs: {type(e).__name__}: {e}") from None
        sync()
        from tuner.model.ranges import ModuleRanges
        modules = ModuleRanges(model)
        acts = [ProfilerActivity.CPU]
        if device == "cuda":
            acts.append(ProfilerActivity.CUDA)
        elif device == "npu":
            acts = _npu_activities() or acts
        try:
            with profile(activities=acts, record_shapes=True) as prof:
                for _ in range(iterations):
                    model(*inputs)
                sync()
        finally:
            modules.remove()
    on_device = device != "cpu"
    groups: dict[tuple, list] = {}
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore")
        events = prof.events()
    raw = None if events and hasattr(events[0], "input_dtypes") else _kineto_dtypes(prof)
    top = _top_level(events)
    modules.count(top)
    module_calls: dict[tuple, int] = {}
    for e in events:
        key = modules.row_of(e)
        if key is not None:
            module_calls[key] = module_calls.get(key, 0) + 1
    for e in top:
        t = (getattr(e, "device_time_total", None) or 0.0) if on_device else e.cpu_time_total
        key = modules.absorbing(e)
        if key is None:
            key = (e.name, _args_of(e, raw))
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += t * 1e-6
    for key, calls in module_calls.items():  # a routed module is one call however many aten ops
        groups.setdefault(key, [0, 0.0])[0] = calls
    total = sum(t for _, t in groups.values())
    rows = []
    for (name, args), (calls, t) in groups.items():
        rows.append(_assess(OpRow(name, args, calls // iterations or 1, t / iterations,
                                  t / total if total else 0.0), peaks or {}, modules.costs.get((name, args))))
    rows.sort(key=lambda r: -r.total_s)
    import json
    recipes = tuple((name, json.dumps(r, sort_keys=True)) for name, r in modules.recipes.items()
                    if any(row.aten == name for row in rows))
    return Profile(str(path), device, dtype, iterations, total / iterations, tuple(rows),
                   tuple(sorted((peaks or {}).items())), recipes)


def _npu_activities():
    try:
        import torch_npu
        return [torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU]
    except (ImportError, AttributeError):
        return None


# ---- what each row is, and what it could save --------------------------------------------

def meta_call(row: OpRow):
    """(outputs, FLOPs torch counts) of the recorded call rerun on meta tensors; None where it
    cannot be rebuilt (an argument the record does not keep, such as a dtype)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from tuner.core.op import torch_dtype
    names = {"int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
             "uint8": torch.uint8, "bool": torch.bool}
    args = []
    for a in row.args:
        if a.is_tensor:
            dt = names.get(a.dtype) or (torch_dtype(a.dtype) if a.dtype in ("fp32", "fp64", "fp16", "bf16") else None)
            if dt is None:
                return None
            args.append(torch.empty(a.shape, dtype=dt, device="meta"))
        else:
            args.append(list(a.value) if isinstance(a.value, tuple) else a.value)
    fn = getattr(torch.ops.aten, row.aten.split("::", 1)[1], None)
    if fn is None:
        return None
    # The record keeps no strings: an argument such as gelu's approximate="none" comes back as
    # None. Trailing Nones are dropped (their defaults) when the call with them fails.
    for n in range(len(args), -1, -1):
        for positional, names in _bindings(fn, n):
            try:
                with FlopCounterMode(display=False) as counter:
                    out = fn(*args[:positional], **dict(zip(names, args[positional:n])))
            except Exception:  # noqa: BLE001 - not rebuildable from the record this way
                continue
            return _Rebuilt(out, counter, n, names)
        if n == 0 or args[n - 1] is not None:
            return None
    return None


def _bindings(fn, n: int) -> list[tuple[int, tuple[str, ...]]]:
    """How `n` recorded arguments (the record lists them in the schema's order) may be passed:
    (how many positionally, the names of the rest). All positionally first; then, per overload
    whose schema takes them so, the keyword-only ones by name (add's and sub's `alpha`: a call
    that passes it positionally fails)."""
    out: list[tuple[int, tuple[str, ...]]] = [(n, ())]
    for overload in fn.overloads():
        schema = getattr(fn, overload)._schema.arguments
        pos = sum(not a.kwarg_only for a in schema)
        kw = [a.name for a in schema if a.kwarg_only]
        if pos < n <= pos + len(kw) and (pos, tuple(kw[:n - pos])) not in out:
            out.append((pos, tuple(kw[:n - pos])))
    return out


class _Rebuilt(tuple):
    """(outputs, FLOPs) of `meta_call`, `n_args`: how many recorded arguments the call took,
    and `keywords`: the names its last ones are passed by (keyword-only in the op's schema)."""

    def __new__(cls, out, counter, n_args: int, keywords: tuple[str, ...] = ()):
        import torch
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        self = super().__new__(cls, (outs, float(counter.get_total_flops()) or None))
        self.n_args, self.keywords = n_args, keywords
        return self


def _nbytes(shape, dtype_bytes: int) -> float:
    return float(math.prod(shape)) * dtype_bytes


def _assess(row: OpRow, peaks: dict[str, float], cost: tuple[float, float] | None = None) -> OpRow:
    """`row` with its bound and what a perfect kernel could save. `cost`: (FLOPs, bytes of the
    outputs and parameters) of a module extracted whole, from its forward on meta tensors."""
    import dataclasses

    from tuner.core.op import DTYPE_BYTES
    size = {"int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, **DTYPE_BYTES}
    moved = sum(_nbytes(a.shape, size.get(a.dtype, 4)) for a in row.args if a.is_tensor)
    flops = None
    whole = row.aten.startswith(("module::", "class::"))
    called = None if whole else meta_call(row)
    if cost is not None:
        flops, out_bytes = cost
        moved += out_bytes
    elif whole:  # its outputs: the shape of its first input (rope: of q and k)
        for a in row.args[:2 if row.aten == "module::rope" else 1]:
            moved += _nbytes(a.shape, size.get(a.dtype, 4))
    if called is not None:
        outs, flops = called
        moved += sum(float(o.numel()) * o.element_size() for o in outs)
    bound, what = None, ""
    if peaks.get("copy_gbps") and moved:
        bound, what = moved / (peaks["copy_gbps"] * 1e9), "bytes at copy bandwidth"
    dt = row.dtypes.split(",")[0] if row.dtypes else "fp32"
    rate = peaks.get(f"{dt}_gflops") or peaks.get("fp32_gflops")
    if flops and rate:
        b = flops / (rate * 1e9)
        if bound is None or b > bound:
            bound, what = b, "FLOPs at the matmul rate"
    saving = None
    if bound is not None and row.per_call_s > 0:
        saving = row.share * max(0.0, 1.0 - bound / row.per_call_s)
    return dataclasses.replace(row, bound_s=bound, bound_what=what, saving=saving, flops=flops,
                               bytes=moved or None, library=library_match(row))


def library_calls(row: OpRow) -> list[tuple[str, str, str]]:
    """(op, shape, dtype) of each library op call that computes the row: one, or none; a
    model's rope function (q and k rotated in one call) two."""
    if row.library is None:
        return []
    if row.aten == "module::rope" and len(row.args) > 1 and row.args[1].shape != row.args[0].shape:
        return [row.library, ("rope", "x".join(map(str, row.args[1].shape)), row.library[2])]
    return [row.library]


def library_match(row: OpRow) -> tuple[str, str, str] | None:
    """(op, shape, dtype) of the built-in op that computes exactly this call, or None."""
    t = [a for a in row.args if a.is_tensor]
    s = [a.value for a in row.args if not a.is_tensor]
    if not t or t[0].dtype not in ("fp32", "fp64", "fp16", "bf16"):
        return None
    x, dt = t[0], t[0].dtype

    def rows_cols(shape):
        return (math.prod(shape[:-1]), shape[-1]) if len(shape) >= 2 else None

    name = row.aten
    if name == "module::rope":  # the model's rope function: q's call (k's: `library_calls`)
        return "rope", "x".join(map(str, x.shape)), dt
    if name.startswith("module::"):  # a module the patch routes (tuner.model.ranges.ModuleRanges)
        m, n = rows_cols(x.shape)
        return name.split("::", 1)[1], f"{m}x{n}", dt
    if name in ("aten::softmax", "aten::_softmax") and s and s[0] in (-1, len(x.shape) - 1) and rows_cols(x.shape):
        m, n = rows_cols(x.shape)
        return "softmax", f"{m}x{n}", dt
    if name == "aten::layer_norm" and len(t) == 3 and rows_cols(x.shape) and s and tuple(s[0] or ()) == (x.shape[-1],) \
            and len(s) > 1 and s[1] is not None and abs(float(s[1]) - 1e-5) < 1e-12:
        m, n = rows_cols(x.shape)
        return "layernorm", f"{m}x{n}", dt
    if name == "aten::rms_norm" and len(t) == 2 and rows_cols(x.shape) and s and tuple(s[0] or ()) == (x.shape[-1],) \
            and len(s) > 1 and s[1] is not None and abs(float(s[1]) - 1e-6) < 1e-12:
        m, n = rows_cols(x.shape)
        return "rmsnorm", f"{m}x{n}", dt
    if name in ("aten::mm", "aten::matmul") and len(t) == 2 and len(x.shape) == 2 and len(t[1].shape) == 2 and x.shape[1] == t[1].shape[0]:
        return "matmul", f"{x.shape[0]}x{t[1].shape[1]}x{x.shape[1]}", dt
    if name == "aten::scaled_dot_product_attention" and _decode_attention(t, s):
        (b, h, _, d), (_, kh, n, _) = x.shape, t[1].shape
        return "attention_decode", f"{b}x{h}x{kh}x{n}x{d}", dt
    if name == "aten::scaled_dot_product_attention" and len(t) == 3 and len(x.shape) == 4 \
            and t[1].shape == x.shape and t[2].shape == x.shape and len(s) >= 3 \
            and s[0] is None and s[1] in (0, 0.0) and all(v in (None, False) for v in s[3:]):
        # (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa): no mask, no dropout,
        # the default scale, no grouped heads
        return ("attention_causal" if s[2] else "attention"), "x".join(map(str, x.shape)), dt
    return None


def _decode_attention(t, s) -> bool:
    """SDPA as a decode step calls it: one query per sequence ([B, H, 1, D]) against a KV cache
    ([B, KH, S, D], H a multiple of KH, grouped heads asked for where KH < H), no mask, no
    dropout, not causal (with one query, SDPA's causal mask would keep key 0 alone), the scale
    1/sqrt(D) (default or given). Args: (q, k, v) tensors; (attn_mask, dropout_p, is_causal,
    scale, enable_gqa) as recorded."""
    if len(t) != 3 or len(t[0].shape) != 4 or len(t[1].shape) != 4 or t[1].shape != t[2].shape:
        return False
    (b, h, one, d), (b2, kh, _, d2) = t[0].shape, t[1].shape
    s = list(s) + [None] * (5 - len(s))
    mask, dropout, causal, scale, gqa = s[:5]
    return (one == 1 and b == b2 and d == d2 and kh > 0 and h % kh == 0 and mask is None
            and dropout in (0, 0.0, None) and not causal and (kh == h or bool(gqa))
            and (scale is None or abs(float(scale) * math.sqrt(d) - 1) < 1e-6))
