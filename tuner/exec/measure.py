"""Verify and time one compiled candidate. Runs inside a benchmark worker process.

Correctness before speed: fresh random inputs for each check (never zeros), outputs
poisoned with NaN before the launch, the reference computed in float64, a per-dtype
tolerance, two checks on different inputs, and inputs checked for writes. Timing: a
warm-up and a number of repetitions sized from an estimate, caches flushed before each,
raw samples kept, and an early stop once a candidate is clearly slower than the best.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
import traceback
from collections import OrderedDict
from typing import Callable

from tuner.core.ops import Op, load_op, out_dtype
from tuner.core.settings import Settings
from tuner.core.values import Measurement, OpSpec, Status

# References are float64 and can be costly (a 4096^3 matmul), so each worker keeps a few
# seeded input sets with their references; every candidate is checked on two of them,
# chosen at random, and a suspiciously fast one on brand-new inputs.
_POOL_SIZE = 4
_pool: OrderedDict[str, list[tuple[int, list]]] = OrderedDict()
_rng = random.SystemRandom()
# Where this process's measurements spent their time (seconds per phase, counts): read by the
# worker's "stats" request, so that a slow sweep can be told apart from a slow harness.
TIMES: dict[str, float] = {"measures": 0, "load_s": 0.0, "check_s": 0.0, "bench_s": 0.0, "reps": 0}


def _nbytes(ts: list) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _budget(fraction: float, total: int | None, floor: int = 2**30) -> int:
    return max(floor, int(fraction * total)) if total else floor


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# One benchmark worker serves every op of a sweep: the sets of ops it measured lately are kept
# (regenerating them on every switch between interleaved ops would dominate), within a share of
# the host's memory (an 8192x8192 set with its float64 reference is ~0.7 GB); least recently
# used ops go first.
_HOST_BUDGET = _budget(0.25, _host_memory())


def _reference(op: Op, seed: int, device=None) -> list:
    """The float64 reference for a seed's inputs, made on `device` (None: the host)."""
    return _reference_of(op, op.make_inputs(seed, device))


_HOST_ONLY: set[str] = set()  # ops whose reference failed on the device: made on the host


def _reference_of(op: Op, xs: list) -> list:
    doubles = [x.double() if x.is_floating_point() else x for x in xs]
    where = doubles[0].device if doubles else None
    key = _op_key(op)
    if where is not None and where.type != "cpu" and key not in _HOST_ONLY:
        try:
            return [r.to(where) for r in op.reference(doubles)]
        except Exception:  # noqa: BLE001 - a reference written for the host (a problem file's)
            _HOST_ONLY.add(key)
    return [r.to(where) if where is not None else r for r in op.reference([x.cpu() for x in doubles])]


def _op_key(op: Op) -> str:
    return op.spec.key + op.spec.source


def _pooled(op: Op, backend=None) -> list[tuple[int, list | None]]:
    """The op's pooled seeds with their host references; (seed, None) for a backend that makes
    its sets on its own device (see _device_set), where nothing is kept on the host."""
    key = _op_key(op)
    if backend is not None and backend.data_device() is not None:
        if key not in _seeds:
            _seeds[key] = [_rng.randrange(1, 2**31) for _ in range(_POOL_SIZE)]
        return [(s, None) for s in _seeds[key]]
    if key in _pool:
        _pool.move_to_end(key)
        return _pool[key]
    seeds = [_rng.randrange(1, 2**31) for _ in range(_POOL_SIZE)]
    _pool[key] = [(s, _reference(op, s)) for s in seeds]

    def held(k: str) -> int:
        return sum(_nbytes(ref) + _nbytes(_pooled_inputs.get((k, s), [])) for s, ref in _pool[k])
    while len(_pool) > 1 and sum(held(k) for k in _pool) > _HOST_BUDGET:
        old, _ = _pool.popitem(last=False)
        for k in [k for k in _pooled_inputs if k[0] == old]:
            del _pooled_inputs[k]
        _drop_device(old)
    return _pool[key]


_seeds: dict[str, list[int]] = {}  # op -> pooled seeds, for backends with a data device
_pooled_inputs: dict[tuple[str, int], list] = {}
# Pristine inputs and the reference of each pooled seed, kept on the device: moving a float64
# reference of 64M elements to the GPU and the inputs back for the write check cost more than
# verifying and timing the kernel (about 1.4 s per candidate at 8192x8192 on an H200). Bounded
# by a share of the device's memory, least recently used first out; a miss costs one copy, or,
# on a backend with a data device, making the set again from its seed there (milliseconds).
# A kernel that writes out of bounds can land in these buffers, so a failed check drops the
# op's device copies (the host copies, and a seed, are out of a kernel's reach) before the
# next check.
_on_device: OrderedDict[tuple[str, int], tuple[object, list, list]] = OrderedDict()


def _drop_device(op_key: str) -> None:
    for k in [k for k in _on_device if k[0] == op_key]:
        del _on_device[k]


def _device_budget(tensors: list) -> int:
    t = next((t for t in tensors if t.device.type == "cuda"), None)
    if t is None:
        return _HOST_BUDGET // 4  # the device is the host (cpu backend): copies of inputs only
    import torch
    return _budget(0.2, torch.cuda.get_device_properties(t.device).total_memory)


def _inputs(op: Op, seed: int) -> list:
    """The inputs of a seed; a pooled seed's are kept, since they are checked again and again."""
    key = (_op_key(op), seed)
    if key not in _pooled_inputs:
        xs = op.make_inputs(seed)
        if seed not in {s for s, _ in _pool.get(key[0], ())}:
            return xs
        _pooled_inputs[key] = xs
    return _pooled_inputs[key]


def _device_set(backend, op: Op, seed: int, ref: list | None) -> tuple[list, list]:
    """(pristine inputs, reference) on the backend's device; kept for a pooled seed. `ref` is
    None when the backend makes its sets on its data device (from the seed, there)."""
    key = (_op_key(op), seed)
    hit = _on_device.get(key)
    if hit is not None and hit[0] is backend:
        _on_device.move_to_end(key)
        return hit[1], hit[2]
    where = backend.data_device()
    if where is not None:
        xs = op.make_inputs(seed, where)
        rs = ref if ref is not None else _reference_of(op, xs)
    else:
        xs = [backend.to_device(x.clone()) for x in _inputs(op, seed)]
        rs = [backend.to_device(r) for r in ref]
    if seed in {s for s, _ in _pool.get(key[0], ())} or seed in _seeds.get(key[0], ()):
        _on_device[key] = (backend, xs, rs)
        budget = _device_budget(xs + rs)
        while len(_on_device) > 1 and sum(_nbytes(v[1]) + _nbytes(v[2]) for v in _on_device.values()) > budget:
            _on_device.popitem(last=False)
    return xs, rs


# Every buffer a check hands the kernel sits between two guard bands of a known byte: a
# kernel that writes a little past the end of a buffer (an unmasked tail, an off-by-one
# bound) or before its start would otherwise corrupt the allocator's heap (a crash some
# evaluations later, blamed on another config) or pass unnoticed. 64 KiB keeps every
# buffer's start as aligned as the allocation (Triton specializes on 16-byte alignment).
_GUARD_BYTES = 65536
_GUARD_BYTE = 0xA5


def _guarded(shape, dtype, device) -> tuple:
    """(a contiguous tensor of `shape`, the byte buffer it sits in, guard bands included)."""
    import torch
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    buf = torch.full((n + 2 * _GUARD_BYTES,), _GUARD_BYTE, dtype=torch.uint8, device=device)
    return buf[_GUARD_BYTES:_GUARD_BYTES + n].view(dtype).view(shape), buf


def _poison(dtype):
    """What an output holds before the launch, so that an element never written shows: NaN, or
    an integer output's most negative value."""
    import torch
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return False if dtype == torch.bool else torch.iinfo(dtype).min


def _stray_write(view, buf, name: str) -> str | None:
    """Where and how far a kernel wrote outside `view` into its guard bands; None if not."""
    g, size = _GUARD_BYTES, view.element_size()
    head = (buf[:g] != _GUARD_BYTE).nonzero()
    tail = (buf[buf.numel() - g:] != _GUARD_BYTE).nonzero()
    if len(tail):
        return f"past the end of {name} (as far as {int(tail.max()) // size + 1} element(s) beyond it)"
    if len(head):
        return f"before the start of {name} (as far as {(g - int(head.min()) + size - 1) // size} element(s) before it)"
    return None


def check(backend, kernel, op: Op, seed: int, ref: list | None) -> tuple[str | None, float, float]:
    """Run once on seed's inputs; return (why it is wrong or None, max abs err, max rel err)."""
    try:
        out = _check(backend, kernel, op, seed, ref)
    except BaseException:
        _drop_device(_op_key(op))
        raise
    if out[0] is not None:
        _drop_device(_op_key(op))
    return out


def _check(backend, kernel, op: Op, seed: int, ref: list | None) -> tuple[str | None, float, float]:
    import torch

    pristine, ref_dev = _device_set(backend, op, seed, ref)
    inputs = [_guarded(x.shape, x.dtype, x.device) for x in pristine]
    for dev, x in zip(inputs, pristine):
        dev[0].copy_(x)
    # Made where the reference lives, so on the device: no host buffer copied over per check.
    outs = [_guarded(r.shape, out_dtype(op, r), r.device) for r in ref_dev]
    for out, _ in outs:
        out.fill_(_poison(out.dtype))
    backend.launch(kernel, [t for t, _ in inputs + outs])
    backend.sync()
    names = [f"input {n}" for n in op.input_names] + [f"output {n}" for n in op.output_names]
    for name, (view, buf) in zip(names, inputs + outs):
        stray = _stray_write(view, buf, name)
        if stray:
            return f"the kernel wrote {stray}", 0.0, 0.0
    inputs = [view for view, _ in inputs]
    outs = [view for view, _ in outs]
    atol, rtol = op.tolerance
    max_abs = max_rel = 0.0
    for name, x, dev in zip(op.input_names, pristine, inputs):
        if not torch.equal(dev, x):  # on the device: no copy back
            return f"the kernel wrote to its input {name}", 0.0, 0.0
    for name, out, r in zip(op.output_names, outs, ref_dev):
        o = out.double()  # compare where the output is, not on the host
        r = r if r.is_floating_point() else r.double()  # a bool reference cannot be subtracted
        if o.shape != r.shape:
            return f"output {name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}", 0.0, 0.0
        nan_out, nan_ref = torch.isnan(o), torch.isnan(r)
        if (nan_out & ~nan_ref).any():
            n = int((nan_out & ~nan_ref).sum())
            return (f"output {name}: {n} of {o.numel()} elements are NaN (never written, or "
                    f"computed NaN)", float("inf"), float("inf"))
        err = (o - r).abs().nan_to_num(0.0)
        rel = err / r.abs().clamp_min(1e-30)
        max_abs = max(max_abs, float(err.max()) if err.numel() else 0.0)
        max_rel = max(max_rel, float(rel.max()) if rel.numel() else 0.0)
        bad = err > atol + rtol * r.abs().nan_to_num(0.0)
        if bad.any():
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            return (f"output {name}: {int(bad.sum())} of {o.numel()} elements off; first at {idx}: "
                    f"got {float(o[idx]):.6g}, expected {float(r[idx]):.6g} "
                    f"(atol {atol:g}, rtol {rtol:g})", max_abs, max_rel)
    return None, max_abs, max_rel


_CHUNK = 32  # timed repetitions queued before the host waits and checks for an early stop


def bench(backend, fn: Callable[[], None], settings: Settings,
          best_s: float | None = None) -> tuple[list[float], bool]:
    """Raw samples of `fn` in seconds, and whether timing stopped early (clearly slower)."""
    first = backend.time_call(fn)  # also a warm-up: first-touch, lazy loading
    t0 = time.perf_counter()
    est = min(first, backend.time_call(fn))
    # The budget is wall time: a repetition costs its cache flush and launch too. Sized from
    # the kernel's time alone, a 20 us kernel on the cpu backend (whose flush writes twice the
    # last-level cache, milliseconds) got max_reps repetitions: ~15 s per candidate, ~90 s
    # for the re-timing of a 3-evaluation run.
    per_rep = max(est, time.perf_counter() - t0, 1e-7)
    n_warm = int(min(100, settings.warmup_s / max(est, 1e-7)))
    for _ in range(n_warm):
        fn()
    backend.sync()
    reps = int(max(settings.min_reps, min(settings.max_reps, settings.bench_budget_s / per_rep)))
    samples: list[float] = []
    while len(samples) < reps:
        # In chunks (queued, waited for once): min_reps first, so that a clearly slower
        # candidate stops as early as before, then larger ones.
        chunk = settings.min_reps if not samples else _CHUNK
        samples.extend(backend.time_calls(fn, min(chunk, reps - len(samples))))
        if (best_s is not None and len(samples) >= settings.min_reps
                and statistics.median(samples) > settings.early_stop_factor * best_s):
            return samples, True
        if settings.precision > 0 and len(samples) >= _PRECISE_MIN and precise(samples, settings.precision):
            break
    return samples, False


_PRECISE_MIN = 32  # samples before the spread is trusted to say the median is known


def precise(samples: list[float], precision: float) -> bool:
    """Whether the median of `samples` is known to within `precision` (relative standard
    error). The spread is read from the interquartile range, which a few outliers (a clock
    step, another process) do not inflate: for normal noise sigma = IQR / 1.349, and the
    median's standard error is 1.2533 sigma / sqrt(n). A stable GPU kernel (IQR ~1 %) gets
    there in about a hundred repetitions, a noisy one runs to its time budget."""
    q = statistics.quantiles(samples, n=4)
    med = statistics.median(samples)
    return med > 0 and 0.929 * (q[2] - q[0]) / math.sqrt(len(samples)) <= precision * med


def measure(backend, artifact: str, spec: OpSpec, settings: Settings,
            best_s: float | None = None, reference_s: float | None = None) -> Measurement:
    op = load_op(spec)
    t0 = time.perf_counter()
    TIMES["measures"] += 1
    try:
        kernel = backend.load(artifact, op)
    except Exception as e:
        return Measurement(Status.RUNTIME_ERROR, detail=f"load failed: {type(e).__name__}: {e}"[:2000])
    finally:
        t1 = time.perf_counter()
        TIMES["load_s"] += t1 - t0
    max_abs = max_rel = 0.0
    t2 = None  # when timing began
    try:
        for seed, ref in _rng.sample(_pooled(op, backend), 2):
            why, a, r = check(backend, kernel, op, seed, ref)
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            if why:
                return Measurement(Status.WRONG_RESULT, max_abs_err=a, max_rel_err=r,
                                   detail=f"{why} (input seed {seed})")
        args = _timing_args(backend, op)
        t2 = time.perf_counter()
        samples, stopped = bench(backend, lambda: backend.launch(kernel, args), settings, best_s)
        TIMES["reps"] += len(samples)
    except Exception as e:  # a candidate that raises at run time (e.g. a Triton launch error)
        tb = traceback.format_exception_only(type(e), e)
        return Measurement(Status.RUNTIME_ERROR, detail="".join(tb).strip()[:2000])
    finally:
        t3 = time.perf_counter()
        TIMES["check_s"] += (t2 or t3) - t1
        TIMES["bench_s"] += t3 - t2 if t2 is not None else 0.0
    detail = f"stopped early: slower than {settings.early_stop_factor:g}x the best" if stopped else ""
    median = max(statistics.median(samples), 1e-12)  # 0 s is suspect, not a division by zero
    if reference_s and median * settings.suspect_speedup < reference_s:
        # Too good to be true until shown otherwise: re-check on inputs never seen before.
        for _ in range(2):
            seed = _rng.randrange(1, 2**31)
            why, _, _ = check(backend, kernel, op, seed, _reference(op, seed, backend.data_device()))
            if why:
                return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel,
                                   f"{reference_s / median:.1f}x faster than the reference, but "
                                   f"on fresh inputs: {why}")
        detail = f"{reference_s / median:.1f}x faster than the reference; re-verified on fresh inputs"
    return Measurement(Status.OK, tuple(samples), max_abs, max_rel, detail)


def _timing_args(backend, op: Op) -> list:
    import torch
    seed, ref = _rng.choice(_pooled(op, backend))
    pristine, ref_dev = _device_set(backend, op, seed, ref)
    xs = [x.clone() for x in pristine]
    specs = [(r.shape, out_dtype(op, r)) for r in ref_dev]
    where = xs[0].device if xs else None
    return xs + [torch.empty(s, dtype=d, device=where) if where is not None
                 else backend.to_device(torch.empty(s, dtype=d)) for s, d in specs]


def time_reference(backend, spec: OpSpec, settings: Settings) -> list[float]:
    """Samples of the torch implementation a user would run today, on the same device."""
    op = load_op(spec)
    where = backend.data_device()
    try:
        xs = op.make_inputs(1, where) if where is not None else [backend.to_device(x) for x in op.make_inputs(1)]
        samples, _ = bench(backend, lambda: op.torch_impl(xs), settings)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if "out of memory" not in str(e).lower():
            raise
        # The first thing a run puts on the device: say what to change, not only what broke.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MemoryError(f"{spec.key}: the inputs and the torch reference at this shape do not fit "
                          f"the device's memory ({first[:300]}); pick a smaller shape") from None
    return samples


def recheck(backend, artifact: str, spec: OpSpec) -> str | None:
    """One more verification on brand-new inputs (for the winner); the reason it fails, or None."""
    op = load_op(spec)
    kernel = backend.load(artifact, op)
    seed = _rng.randrange(1, 2**31)
    why, _, _ = check(backend, kernel, op, seed, _reference(op, seed, backend.data_device()))
    return why


def time_many(backend, artifacts: list[str], spec: OpSpec, settings: Settings,
              rounds: int = 5) -> list[list[float]]:
    """Re-time several candidates interleaved (A B C A B C ...) so drift hits all alike."""
    op = load_op(spec)
    kernels = [backend.load(a, op) for a in artifacts]
    args = _timing_args(backend, op)
    out: list[list[float]] = [[] for _ in kernels]
    for _ in range(rounds):
        for i, k in enumerate(kernels):
            s, _ = bench(backend, lambda k=k: backend.launch(k, args),
                         settings.replace(bench_budget_s=settings.bench_budget_s / rounds,
                                          min_reps=3, precision=0.0))
            out[i].extend(s)
    return out

