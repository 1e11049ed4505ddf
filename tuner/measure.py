"""Verify and time one compiled candidate. Runs inside a benchmark worker process.

Correctness before speed: fresh random inputs for each check (never zeros), outputs
poisoned with NaN before the launch, the reference computed in float64, a per-dtype
tolerance, two checks on different inputs, and inputs checked for writes. Timing: a
warm-up and a number of repetitions sized from an estimate, caches flushed before each,
raw samples kept, and an early stop once a candidate is clearly slower than the best.
"""

from __future__ import annotations

import random
import statistics
import traceback
from typing import Callable

from .ops import Op, load_op
from .settings import Settings
from .values import Measurement, OpSpec, Status

# References are float64 and can be costly (a 4096^3 matmul), so each worker keeps a few
# seeded input sets with their references; every candidate is checked on two of them,
# chosen at random, and a suspiciously fast one on brand-new inputs.
_POOL_SIZE = 4
_pool: dict[str, list[tuple[int, list]]] = {}
_rng = random.SystemRandom()


def _reference(op: Op, seed: int) -> list:
    xs = op.make_inputs(seed)
    return op.reference([x.double() if x.is_floating_point() else x for x in xs])


def _pooled(op: Op) -> list[tuple[int, list]]:
    key = op.spec.key + op.spec.source
    if key not in _pool:
        seeds = [_rng.randrange(1, 2**31) for _ in range(_POOL_SIZE)]
        _pool[key] = [(s, _reference(op, s)) for s in seeds]
    return _pool[key]


_pooled_inputs: dict[tuple[str, int], list] = {}


def _inputs(op: Op, seed: int) -> list:
    """The inputs of a seed; a pooled seed's are kept, since they are checked again and again."""
    key = (op.spec.key + op.spec.source, seed)
    if key not in _pooled_inputs:
        xs = op.make_inputs(seed)
        if seed not in {s for s, _ in _pool.get(key[0], ())}:
            return xs
        _pooled_inputs[key] = xs
    return _pooled_inputs[key]


def check(backend, kernel, op: Op, seed: int, ref: list) -> tuple[str | None, float, float]:
    """Run once on seed's inputs; return (why it is wrong or None, max abs err, max rel err)."""
    import torch

    host_inputs = _inputs(op, seed)
    inputs = [backend.to_device(x.clone()) for x in host_inputs]
    outs = [backend.to_device(torch.full(r.shape, float("nan"), dtype=host_inputs[0].dtype
                                         if host_inputs and host_inputs[0].is_floating_point()
                                         else r.dtype)) for r in ref]
    backend.launch(kernel, inputs + outs)
    backend.sync()
    atol, rtol = op.tolerance
    max_abs = max_rel = 0.0
    for name, x, dev in zip(op.input_names, host_inputs, inputs):
        if not torch.equal(backend.to_host(dev), x):
            return f"the kernel wrote to its input {name}", 0.0, 0.0
    for name, out, r in zip(op.output_names, outs, ref):
        o, r = out.double(), backend.to_device(r)  # compare where the output is, not on the host
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


def bench(backend, fn: Callable[[], None], settings: Settings,
          best_s: float | None = None) -> tuple[list[float], bool]:
    """Raw samples of `fn` in seconds, and whether timing stopped early (clearly slower)."""
    first = backend.time_call(fn)  # also a warm-up: first-touch, lazy loading
    est = min(first, backend.time_call(fn))
    n_warm = int(min(100, settings.warmup_s / max(est, 1e-7)))
    for _ in range(n_warm):
        fn()
    backend.sync()
    reps = int(max(settings.min_reps, min(settings.max_reps, settings.bench_budget_s / max(est, 1e-7))))
    samples: list[float] = []
    for i in range(reps):
        samples.append(backend.time_call(fn))
        if (best_s is not None and i + 1 >= settings.min_reps
                and statistics.median(samples) > settings.early_stop_factor * best_s):
            return samples, True
    return samples, False


def measure(backend, artifact: str, spec: OpSpec, settings: Settings,
            best_s: float | None = None, reference_s: float | None = None) -> Measurement:
    op = load_op(spec)
    try:
        kernel = backend.load(artifact, op)
    except Exception as e:
        return Measurement(Status.RUNTIME_ERROR, detail=f"load failed: {type(e).__name__}: {e}"[:2000])
    max_abs = max_rel = 0.0
    try:
        for seed, ref in _rng.sample(_pooled(op), 2):
            why, a, r = check(backend, kernel, op, seed, ref)
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            if why:
                return Measurement(Status.WRONG_RESULT, max_abs_err=a, max_rel_err=r,
                                   detail=f"{why} (input seed {seed})")
        args = _timing_args(backend, op)
        samples, stopped = bench(backend, lambda: backend.launch(kernel, args), settings, best_s)
    except Exception as e:  # a candidate that raises at run time (e.g. a Triton launch error)
        tb = traceback.format_exception_only(type(e), e)
        return Measurement(Status.RUNTIME_ERROR, detail="".join(tb).strip()[:2000])
    detail = f"stopped early: slower than {settings.early_stop_factor:g}x the best" if stopped else ""
    median = max(statistics.median(samples), 1e-12)  # 0 s is suspect, not a division by zero
    if reference_s and median * settings.suspect_speedup < reference_s:
        # Too good to be true until shown otherwise: re-check on inputs never seen before.
        for _ in range(2):
            seed = _rng.randrange(1, 2**31)
            why, _, _ = check(backend, kernel, op, seed, _reference(op, seed))
            if why:
                return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel,
                                   f"{reference_s / median:.1f}x faster than the reference, but "
                                   f"on fresh inputs: {why}")
        detail = f"{reference_s / median:.1f}x faster than the reference; re-verified on fresh inputs"
    return Measurement(Status.OK, tuple(samples), max_abs, max_rel, detail)


def _timing_args(backend, op: Op) -> list:
    import torch
    xs = [backend.to_device(x.clone()) for x in _inputs(op, _rng.choice(_pooled(op))[0])]
    ref_shapes = [r.shape for r in _pooled(op)[0][1]]
    dt = xs[0].dtype if xs and xs[0].is_floating_point() else torch.float32
    return xs + [backend.to_device(torch.empty(s, dtype=dt)) for s in ref_shapes]


def time_reference(backend, spec: OpSpec, settings: Settings) -> list[float]:
    """Samples of the torch implementation a user would run today, on the same device."""
    op = load_op(spec)
    xs = [backend.to_device(x) for x in op.make_inputs(1)]
    samples, _ = bench(backend, lambda: op.torch_impl(xs), settings)
    return samples


def recheck(backend, artifact: str, spec: OpSpec) -> str | None:
    """One more verification on brand-new inputs (for the winner); the reason it fails, or None."""
    op = load_op(spec)
    kernel = backend.load(artifact, op)
    seed = _rng.randrange(1, 2**31)
    why, _, _ = check(backend, kernel, op, seed, _reference(op, seed))
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
                                          min_reps=3))
            out[i].extend(s)
    return out

