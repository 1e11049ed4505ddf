"""Operators: what a kernel must compute, with a reference, an input maker and a roofline.

`OpSpec` (in values.py) is the picklable identity; `load_op(spec)` gives the live `Op`
in whichever process needs it (the benchmark worker computes references there).
Built-in ops live in BUILTINS; a KernelBench-format problem file (`class Model`,
`get_inputs`, `get_init_inputs`) loads through `tuner.problem`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tuner.core.op import DTYPE_BYTES, DTYPES, TOLERANCE, Op, OpError, torch_dtype  # noqa: F401 - the op module's API
from tuner.core.values import OpSpec


@dataclass(frozen=True)
class Builtin:
    name: str
    size_names: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    doc: str


BUILTINS = {
    "softmax": Builtin("softmax", ("M", "N"), ("x",), ("y",), "y = softmax(x, dim=-1), x: [M, N]"),
    "rmsnorm": Builtin("rmsnorm", ("M", "N"), ("x", "w"), ("y",),
                       "y = x / sqrt(mean(x^2, -1) + 1e-6) * w, x: [M, N], w: [N]"),
    "layernorm": Builtin("layernorm", ("M", "N"), ("x", "w", "b"), ("y",),
                         "y = (x - mean) / sqrt(var + 1e-5) * w + b over the last dim, x: [M, N]"),
    "matmul": Builtin("matmul", ("M", "N", "K"), ("a", "b"), ("c",), "c = a @ b, a: [M, K], b: [K, N]"),
    "add_rmsnorm": Builtin("add_rmsnorm", ("M", "N"), ("x", "r", "w"), ("y", "h"),
                           "h = x + r; y = rmsnorm(h) * w (eps 1e-6), x, r: [M, N], w: [N]"),
    "swiglu": Builtin("swiglu", ("M", "N"), ("a", "b"), ("y",), "y = silu(a) * b, a, b: [M, N]"),
    "rope": Builtin("rope", ("T", "H", "D"), ("x", "cos", "sin"), ("y",),
                    "rotary embedding (rotate-half): x: [T, H, D], cos, sin: [T, D/2]"),
    "cross_entropy": Builtin("cross_entropy", ("M", "V"), ("logits", "target"), ("loss",),
                             "loss = logsumexp(logits) - logits[target] per row, logits: [M, V], target: [M] int64"),
    "attention": Builtin("attention", ("B", "H", "S", "D"), ("q", "k", "v"), ("o",),
                         "o = softmax(q k^T / sqrt(D)) v, q, k, v: [B, H, S, D]"),
    "attention_causal": Builtin("attention_causal", ("B", "H", "S", "D"), ("q", "k", "v"), ("o",),
                                "attention with a causal mask, q, k, v: [B, H, S, D]"),
    "attention_decode": Builtin("attention_decode", ("B", "H", "KH", "S", "D"), ("q", "k", "v"), ("o",),
                                "one query per sequence against its KV cache, query head h reading KV "
                                "head h // (H / KH): o[b, h] = softmax(q[b, h] k[b, g]^T / sqrt(D)) v[b, g], "
                                "q: [B, H, D], k, v: [B, KH, S, D]"),
}
RMS_EPS, LN_EPS = 1e-6, 1e-5

# Each built-in op's arguments (inputs, then outputs, in BUILTINS' order) as the harness
# allocates them: dims in the op's size names ("D/2": half of D), and `int64` where the
# argument is not of the op's dtype. What `make` and the reference produce, written down so
# that `arg_specs` runs no torch op for a built-in (shape inference on meta tensors goes through
# torch's Python references, whose first call imports torch._dynamo: a second per worker).
# tests/test_problem_sizes.py holds the two equal for every op.
BUILTIN_ARGS = {
    "softmax": ("M N", "M N"),
    "rmsnorm": ("M N", "N", "M N"),
    "layernorm": ("M N", "N", "N", "M N"),
    "matmul": ("M K", "K N", "M N"),
    "add_rmsnorm": ("M N", "M N", "N", "M N", "M N"),
    "swiglu": ("M N", "M N", "M N"),
    "rope": ("T H D", "T D/2", "T D/2", "T H D"),
    "cross_entropy": ("M V", "M int64", "M"),
    "attention": ("B H S D", "B H S D", "B H S D", "B H S D"),
    "attention_causal": ("B H S D", "B H S D", "B H S D", "B H S D"),
    "attention_decode": ("B H D", "B KH S D", "B KH S D", "B H D"),
}


def parse_shape(op: str, shape: str) -> tuple[tuple[str, int], ...]:
    """'4096x1024' -> (('M', 4096), ('N', 1024)) using the op's size names."""
    b = BUILTINS[op]
    parts = re.split(r"[x×,*]", shape.strip().lower())
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) != len(b.size_names) or any(d <= 0 for d in dims):
        raise OpError(f"bad shape {shape!r} for {op}: expected {len(b.size_names)} positive integers "
                      f"joined by 'x' ({'x'.join(b.size_names)}, e.g. "
                      f"{'x'.join(['1024'] * len(b.size_names))}); {op}: {b.doc}")
    if op == "attention_decode" and dims[1] % dims[2]:
        raise OpError(f"bad shape {shape!r} for attention_decode: the query heads H={dims[1]} must be a "
                      f"multiple of the KV heads KH={dims[2]} (each KV head serves H / KH query heads)")
    return tuple(zip(b.size_names, dims))


def parse_sizes(items: list[str]) -> dict[str, int]:
    """`--size NAME=VALUE` flags (a problem file's module-level integer constants)."""
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        try:
            if not sep or not k.isidentifier():
                raise ValueError
            out[k] = int(v)
        except ValueError:
            raise OpError(f"--size {item!r}: expected NAME=INTEGER, e.g. --size batch_size=16") from None
    return out


def did_you_mean(name: str, choices) -> str:
    """" (did you mean 'softmax'?)" for a name one typo away from one of `choices`, else ""."""
    import difflib
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def builtin_spec(op: str, shape: str, dtype: str = "fp32") -> OpSpec:
    if op not in BUILTINS:
        raise OpError(f"unknown op {op!r}{did_you_mean(op, BUILTINS)}; built-in ops: {', '.join(BUILTINS)} "
                      f"(or pass --op path/to/problem.py for a KernelBench-format file)")
    if dtype not in DTYPES:
        raise OpError(f"unknown dtype {dtype!r}{did_you_mean(dtype, DTYPES)}; one of {', '.join(DTYPES)}")
    return OpSpec(name=op, source=op, sizes=parse_shape(op, shape), dtype=dtype, kind="builtin")


def _builtin_op(spec: OpSpec) -> Op:
    import torch
    import torch.nn.functional as F

    b = BUILTINS[spec.name]
    s = spec.size_dict()
    dt = torch_dtype(spec.dtype)
    M, N = s.get("M", 0), s.get("N", 0)
    nbytes = DTYPE_BYTES[spec.dtype]
    atol, rtol = TOLERANCE[spec.dtype]

    gen = _Draw

    if spec.name == "softmax":
        def make(seed, device=None):
            return [gen(seed, device).randn(M, N, dtype=torch.float64).mul_(3).to(dt)]
        ref = lambda xs: [torch.softmax(xs[0], -1)]  # noqa: E731
        impl = ref
        flops, moved = 5.0 * M * N, 2.0 * M * N * nbytes
    elif spec.name == "rmsnorm":
        def make(seed, device=None):
            g = gen(seed, device)
            return [g.randn(M, N, dtype=torch.float64).to(dt),
                    (1 + 0.1 * g.randn(N, dtype=torch.float64)).to(dt)]

        def ref(xs):
            x, w = xs
            return [x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w]
        impl = lambda xs: [F.rms_norm(xs[0], (N,), xs[1], RMS_EPS)]  # noqa: E731
        flops, moved = 4.0 * M * N, (2.0 * M * N + N) * nbytes
    elif spec.name == "layernorm":
        def make(seed, device=None):
            g = gen(seed, device)
            return [g.randn(M, N, dtype=torch.float64).add_(0.5).to(dt),
                    (1 + 0.1 * g.randn(N, dtype=torch.float64)).to(dt),
                    (0.1 * g.randn(N, dtype=torch.float64)).to(dt)]
        ref = lambda xs: [F.layer_norm(xs[0], (N,), xs[1], xs[2], LN_EPS)]  # noqa: E731
        impl = ref
        flops, moved = 7.0 * M * N, (2.0 * M * N + 2 * N) * nbytes
    elif spec.name == "matmul":
        K = s["K"]

        def make(seed, device=None):
            g = gen(seed, device)
            return [g.randn(M, K, dtype=torch.float64).to(dt),
                    g.randn(K, N, dtype=torch.float64).to(dt)]
        ref = lambda xs: [xs[0] @ xs[1]]  # noqa: E731
        impl = ref
        flops, moved = 2.0 * M * N * K, (M * K + K * N + M * N) * nbytes
        # Accumulating K products: rounding grows like sqrt(K) in the absolute error.
        atol = atol * math.sqrt(K) * 4
        rtol = rtol * 10
    elif spec.name in _MORE:
        make, ref, impl, flops, moved = _MORE[spec.name](s, dt, nbytes, gen)
    else:  # pragma: no cover - BUILTINS and this chain are edited together
        raise OpError(f"unreachable: builtin {spec.name!r} has no definition")
    return Op(spec, b.inputs, b.outputs, make, ref, impl, flops, moved, (atol, rtol))


class _Draw:
    """Seeded random tensors made on one device (the host unless told otherwise). A GPU makes
    the verification sets of a large shape in milliseconds where the host takes seconds per
    set, and every device worker of a sweep makes its own. The same seed gives the same
    tensors on the same kind of device, not across kinds (their generators differ)."""

    def __init__(self, seed: int, device=None):
        import torch
        self.device = torch.device(device or "cpu")
        # Meta tensors (shapes and dtypes only, no data) take no generator.
        self.g = None if self.device.type == "meta" else torch.Generator(device=self.device).manual_seed(seed)

    # On meta, `empty`: torch's random draws there go through its Python references, whose
    # first call in a process imports torch._dynamo (~1 s); a meta tensor holds no values anyway.
    def randn(self, *shape, dtype=None):
        import torch
        if self.g is None:
            return torch.empty(*shape, dtype=dtype, device=self.device)
        return torch.randn(*shape, generator=self.g, dtype=dtype, device=self.device)

    def rand(self, *shape):
        import torch
        if self.g is None:
            return torch.empty(*shape, device=self.device)
        return torch.rand(*shape, generator=self.g, device=self.device)

    def randint(self, low: int, high: int, shape: tuple):
        import torch
        if self.g is None:
            return torch.empty(shape, dtype=torch.int64, device=self.device)
        return torch.randint(low, high, shape, generator=self.g, device=self.device)


def _compute_device(xs: list):
    """Where a costly float64 reference runs: the GPU when there is one (meta stays meta)."""
    import torch
    if xs[0].device.type != "cpu" or not torch.cuda.is_available():
        return xs[0].device
    return torch.device("cuda")


def _add_rmsnorm(s, dt, nbytes, gen):
    import torch
    import torch.nn.functional as F
    M, N = s["M"], s["N"]

    def make(seed, device=None):
        g = gen(seed, device)
        return [g.randn(M, N).to(dt), g.randn(M, N).to(dt),
                (1 + 0.1 * g.randn(N)).to(dt)]

    def ref(xs):
        x, r, w = xs
        h = x + r
        return [h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w, h]

    def impl(xs):
        h = xs[0] + xs[1]
        return [F.rms_norm(h, (N,), xs[2], RMS_EPS), h]
    return make, ref, impl, 5.0 * M * N, (4.0 * M * N + N) * nbytes


def _swiglu(s, dt, nbytes, gen):
    import torch
    import torch.nn.functional as F
    M, N = s["M"], s["N"]

    def make(seed, device=None):
        g = gen(seed, device)
        return [g.randn(M, N).mul_(2).to(dt), g.randn(M, N).to(dt)]
    ref = lambda xs: [xs[0] * torch.sigmoid(xs[0]) * xs[1]]  # noqa: E731
    impl = lambda xs: [F.silu(xs[0]) * xs[1]]  # noqa: E731
    return make, ref, impl, 6.0 * M * N, 3.0 * M * N * nbytes


def _rope(s, dt, nbytes, gen):
    import torch
    T, H, D = s["T"], s["H"], s["D"]
    if D % 2:
        raise OpError(f"rope needs an even head dim D, got {D}")

    def make(seed, device=None):
        g = gen(seed, device)
        theta = g.rand(T, D // 2) * (2 * math.pi)
        return [g.randn(T, H, D).to(dt), theta.cos().to(dt), theta.sin().to(dt)]

    def rope(xs):
        x, c, sn = xs
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        c, sn = c[:, None, :], sn[:, None, :]
        return [torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)]
    return make, rope, rope, 3.0 * T * H * D, (2.0 * T * H * D + T * D) * nbytes


def _cross_entropy(s, dt, nbytes, gen):
    import torch
    import torch.nn.functional as F
    M, V = s["M"], s["V"]

    def make(seed, device=None):
        g = gen(seed, device)
        return [g.randn(M, V).mul_(2).to(dt), g.randint(0, V, (M,))]

    def ref(xs):
        dev = _compute_device(xs)
        x, t = xs[0].to(dev), xs[1].to(dev)
        loss = torch.logsumexp(x, -1) - x.gather(1, t[:, None]).squeeze(1)
        return [loss.to(xs[0].device)]
    impl = lambda xs: [F.cross_entropy(xs[0], xs[1], reduction="none")]  # noqa: E731
    return make, ref, impl, 4.0 * M * V, M * V * nbytes + M * (8 + nbytes)


def _attention(causal):
    def build(s, dt, nbytes, gen):
        import torch
        import torch.nn.functional as F
        B, H, S, D = s["B"], s["H"], s["S"], s["D"]

        def make(seed, device=None):
            g = gen(seed, device)
            return [g.randn(B, H, S, D).to(dt) for _ in range(3)]

        def ref(xs):
            dev = _compute_device(xs)
            outs = []
            for b in range(B):  # one batch at a time bounds the float64 score matrix
                q, k, v = (x[b].to(dev) for x in xs)
                att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
                if causal:
                    att = att.masked_fill(torch.ones(S, S, dtype=torch.bool, device=dev).triu(1), -math.inf)
                outs.append((torch.softmax(att, -1) @ v).to(xs[0].device))
            return [torch.stack(outs)]
        impl = lambda xs: [F.scaled_dot_product_attention(*xs, is_causal=causal)]  # noqa: E731
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        return make, ref, impl, flops, 4.0 * B * H * S * D * nbytes
    return build


def _attention_decode(s, dt, nbytes, gen):
    import torch
    import torch.nn.functional as F
    B, H, KH, S, D = s["B"], s["H"], s["KH"], s["S"], s["D"]
    group = H // KH

    def make(seed, device=None):
        g = gen(seed, device)
        return [g.randn(B, H, D).to(dt), g.randn(B, KH, S, D).to(dt), g.randn(B, KH, S, D).to(dt)]

    def ref(xs):
        dev = _compute_device(xs)
        outs = []
        for b in range(B):  # one sequence at a time bounds the float64 copies of its cache
            q, k, v = (x[b].to(dev) for x in xs)
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # [H, S, D]
            att = torch.softmax((k @ q[:, :, None]).squeeze(-1) / math.sqrt(D), -1)  # [H, S]
            outs.append((att[:, None, :] @ v).squeeze(1).to(xs[0].device))
        return [torch.stack(outs)]
    impl = lambda xs: [F.scaled_dot_product_attention(xs[0][:, :, None], xs[1], xs[2],  # noqa: E731
                                                      enable_gqa=group > 1).squeeze(2)]
    return make, ref, impl, 4.0 * B * H * S * D, (2.0 * B * KH * S * D + 2.0 * B * H * D) * nbytes


_MORE = {"add_rmsnorm": _add_rmsnorm, "swiglu": _swiglu, "rope": _rope, "cross_entropy": _cross_entropy,
         "attention_decode": _attention_decode,
         "attention": _attention(False), "attention_causal": _attention(True)}


_CACHE: dict[str, Op] = {}


def load_op(spec: OpSpec) -> Op:
    """The live Op for a spec (cached per process)."""
    key = spec.key + "|" + spec.source
    if key not in _CACHE:
        if spec.kind == "builtin":
            if spec.name not in BUILTINS:
                raise OpError(f"unknown op {spec.name!r}; built-in ops: {', '.join(BUILTINS)}")
            _CACHE[key] = _builtin_op(spec)
        elif spec.kind == "kernelbench":
            from tuner.core.problem import problem_op  # imports this module: loaded when first needed
            _CACHE[key] = problem_op(spec)
        else:
            raise OpError(f"unknown op kind {spec.kind!r}")
    return _CACHE[key]


def out_dtype(op: Op, ref_out):
    """The dtype the harness gives an output, from the reference's: a floating one the op's
    dtype, another its own (argmax's int64 indices). One rule for the check, the timing, the
    compile-ahead and the runtime: where they differed, a kernel wrote past a buffer."""
    return torch_dtype(op.spec.dtype) if ref_out.is_floating_point() else ref_out.dtype


def arg_specs(op: Op) -> tuple[list[tuple[tuple[int, ...], Any]], list[tuple[tuple[int, ...], Any]]]:
    """(shape, dtype) of the kernel's inputs and outputs, as the harness allocates them. The
    inputs are made on the meta device (a built-in op's draw no data), the output shapes come
    from the reference on them; a reference that cannot run on meta tensors gets one real call
    on seed-0 inputs."""
    import contextlib

    import torch
    if op.spec.kind == "builtin":
        return _builtin_args(op)
    try:
        xs = op.make_inputs(0, "meta")
    except Exception:  # noqa: BLE001 - inputs that cannot be made there
        xs = op.make_inputs(0)
    outs = None
    with contextlib.suppress(Exception):
        outs = op.reference([x.to("meta", torch.float64) if x.is_floating_point() else x.to("meta")
                             for x in xs])
    if outs is None:
        outs = op.reference([x.double() if x.is_floating_point() else x for x in op.make_inputs(0)])
    return [(tuple(x.shape), x.dtype) for x in xs], [(tuple(o.shape), out_dtype(op, o)) for o in outs]


def _builtin_args(op: Op) -> tuple[list, list]:
    """`arg_specs` of a built-in op, from BUILTIN_ARGS."""
    import torch
    sizes = dict(op.sizes)
    specs = []
    for text in BUILTIN_ARGS[op.spec.name]:
        dims, dtype = [], torch_dtype(op.spec.dtype)
        for word in text.split():
            if word == "int64":
                dtype = torch.int64
            else:
                name, _, div = word.partition("/")
                dims.append(sizes[name] // int(div or 1))
        specs.append((tuple(dims), dtype))
    n = len(op.input_names)
    return specs[:n], specs[n:]


_C_TYPES = {"torch.int64": "int64_t", "torch.int32": "int32_t", "torch.int16": "int16_t",
            "torch.int8": "int8_t", "torch.uint8": "uint8_t", "torch.bool": "bool"}


def c_entry(op: Op, ctype: str) -> str:
    """The C entry a cpu-backend kernel of `op` exports: floating tensors as `ctype` (the op's
    dtype), integer ones (cross_entropy's targets, argmax's indices) as their own type, after
    the headers those types need (an entry copied without them did not compile: "unknown
    type name 'bool'")."""
    ins, outs = arg_specs(op)
    types = [_C_TYPES.get(str(dt), ctype) for _, dt in ins + outs]
    args = [f"const {t} *{n}" for t, n in zip(types, op.input_names)]
    args += [f"{t} *{n}" for t, n in zip(types[len(ins):], op.output_names)]
    headers = sorted({"stdbool.h" if t == "bool" else "stdint.h" for t in types if t in _C_TYPES.values()})
    return "\n".join([f"#include <{h}>" for h in headers] + [f"void tuner_kernel({', '.join(args)})"])


def dtype_label(dtype, op_dtype: str) -> str:
    """A tensor's dtype as the prompt and messages name it: the op's for floating ones."""
    return op_dtype if dtype.is_floating_point else str(dtype).replace("torch.", "")


def ceiling(flops: float | None, nbytes: float, seconds: float, dtype: str,
            peaks: dict[str, float]) -> dict | None:
    """Where a time sits under the roofline, against the bound that binds: the op's FLOPs at the
    device's matmul rate for this dtype (`<dtype>_gflops`, else fp32's) or its bytes at the
    measured copy bandwidth, whichever takes longer (a GEMM that is memory-bound at its shape is
    held to bandwidth, a small-K one no longer to a FLOP rate it could never reach). `value` is
    the peak, `achieved` the op's rate, `percent` the bound's time over the time taken. None
    when the device reports neither peak."""
    bounds = []
    key = f"{dtype}_gflops" if peaks.get(f"{dtype}_gflops") else "fp32_gflops"
    if flops and peaks.get(key):
        rate = flops / seconds / 1e9
        bounds.append((flops / (peaks[key] * 1e9), {
            "what": f"{key.split('_')[0]} matmul rate (measured)", "value": peaks[key], "achieved": rate,
            "unit": "GFLOP/s", "percent": 100 * rate / peaks[key]}))
    if peaks.get("copy_gbps") and nbytes:
        rate = nbytes / seconds / 1e9
        bounds.append((nbytes / (peaks["copy_gbps"] * 1e9), {
            "what": "copy bandwidth (measured)", "value": peaks["copy_gbps"], "achieved": rate,
            "unit": "GB/s", "percent": 100 * rate / peaks["copy_gbps"]}))
    return max(bounds, key=lambda b: b[0])[1] if bounds else None


def render_context(op: Op) -> dict[str, Any]:
    """What a template and a space may read of the op: its sizes and dtype facts, and for a
    problem file each input's and output's actual extents (`in0_dim1`, `out0_dim0`, ...): a
    file's sizes need not be the inputs' dims (a shape it derives, a dim it writes as a
    number), and a kernel written against the dims stays right whatever the file does."""
    ctx: dict[str, Any] = dict(op.sizes)
    ctx["DTYPE_BYTES"] = DTYPE_BYTES[op.spec.dtype]
    ctx["dtype"] = op.spec.dtype
    ctx["op"] = op.spec.name
    if op.spec.kind != "builtin":
        ctx.update(dims_context(op))
    ctx.update({k: v for k, v in op.context if k not in ctx})
    return ctx


def dims_context(op: Op) -> dict[str, int]:
    ins, outs = arg_specs(op)
    out: dict[str, int] = {}
    for names, specs in ((op.input_names, ins), (op.output_names, outs)):
        for name, (shape, _) in zip(names, specs):
            for d, extent in enumerate(shape):
                out[f"{name}_dim{d}"] = int(extent)
    return {k: v for k, v in out.items() if k not in op.sizes}


def check_fits(op: Op, memory_bytes: int | None = None) -> None:
    """Refuse, before any worker starts, a shape whose verification data cannot fit in this
    machine's memory: a few seeded input sets are kept with float64 references (see measure),
    about (sets + 2) float64 copies of every element the op moves."""
    import os
    if memory_bytes is None:
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return
    elements = op.bytes / DTYPE_BYTES.get(op.spec.dtype, 4)
    need = elements * 8 * (4 + 2)
    if need > memory_bytes:
        shape = "x".join(str(v) for _, v in op.spec.sizes) or op.spec.name
        raise OpError(f"{op.spec.name} {shape} {op.spec.dtype} is too large to verify here: its "
                      f"inputs, outputs and float64 references need about {need / 2**30:.0f} GiB "
                      f"and this machine has {memory_bytes / 2**30:.0f} GiB of memory; pick a "
                      f"smaller shape")
