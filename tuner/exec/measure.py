"""Verify and time one compiled candidate. Runs inside a benchmark worker process.

The candidate is assumed to be trying to win without doing the work, so a timed call must
be one it cannot tell from a checked one:

* Checks: random inputs (never zeros) whose float64 reference is known, outputs filled
  before the launch with a poison drawn at random each time (NaN, or a random finite value:
  a kernel that computes only when it sees NaN is caught), every buffer between guard bands,
  inputs compared with their pristine copies afterwards, a per-dtype tolerance; two checks.
* Range: one check more on inputs scaled by RANGE_SCALE (exact in binary floating point; whole
  rows and outliers in the others, `_scaled`), held
  to torch's own error there and to its sensitivity to its inputs' rounding (torch_slack): a
  kernel correct only on inputs of the checks' magnitude (a softmax or cross-entropy without
  the row max, an accumulation in a narrower type that overflows) fails it, where torch's own
  implementation in the op's dtype stays finite (an op whose own implementation overflows, or
  leaves its domain, at that range is not held to it).
* Timing rotates over several buffer sets (distinct inputs, outputs and addresses), so no two
  consecutive calls see the same buffers, and each timed call's outputs are poisoned afresh
  before it, untimed (no call finds its own earlier result there to skip the work on); after
  every chunk of timed calls, outside the timed region, the outputs of each set are checked
  against that set's reference, its inputs and guard bands against their pristine state, and
  its outputs poisoned again. The order of the sets and the length of each chunk are drawn
  at random: a kernel that knew which of its calls would be checked (each set's last call of
  a chunk) could do the work on those alone. A candidate whose timed outputs are wrong is
  WRONG_RESULT, with the call that showed it.
* History: single calls on inputs the candidate has never seen, their references made only
  after the calls, are timed after the search's timing; a candidate much faster on buffers
  it has seen (a result cache, a skip when handed the same buffers, a copy of a reference
  found in device memory) is SUSPECT, with both times.
* Physics: a median under `floor_s` (the time the op's bytes or FLOPs take at the device's
  measured peaks, with a margin: tuner/exec/evaluate.py) is SUSPECT, with the bound it broke,
  after a re-check on brand-new inputs.

Timing: a warm-up and a number of repetitions sized from an estimate, caches flushed before
each, raw samples kept, and an early stop once a candidate is clearly slower than the best.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
import traceback
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

from tuner.backends.base import BackendUnavailable, ClockMismatch, OutsideKill, Refused
from tuner.core.ops import Op, load_op, out_dtype
from tuner.core.settings import Settings
from tuner.core.tolerance import SLACK_FACTOR, poison as _poison, torch_slack
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
        rs = list(ref) if getattr(backend, "verify_on_host", False) else [backend.to_device(r) for r in ref]
    if not backend.isolated_kernels:  # else out of a kernel's reach (see _untouched)
        for t in xs + rs:  # what a check later compares them with
            t._tuner_digest = _digest(t)
    if seed in {s for s, _ in _pool.get(key[0], ())} or seed in _seeds.get(key[0], ()):
        _on_device[key] = (backend, xs, rs)
        budget = _device_budget(xs + rs)
        while len(_on_device) > 1 and sum(_nbytes(v[1]) + _nbytes(v[2]) for v in _on_device.values()) > budget:
            _on_device.popitem(last=False)
    return xs, rs


def _digest(t) -> int:
    """A byte sum of `t`, kept on the host, out of a kernel's reach."""
    import torch
    return int(t.detach().reshape(-1).contiguous().view(torch.uint8).sum(dtype=torch.int64))


def _untouched(op: Op, tensors: list) -> str | None:
    """Why the harness's own copies (pristine inputs, the reference) are no longer what they
    were made as, or None: a kernel that stores far outside its buffers, on a device where
    nothing faults, can land in them, and one that wrote its own output over the reference
    would pass every comparison."""
    for t in tensors:
        want = getattr(t, "_tuner_digest", None)
        if want is not None and _digest(t) != want:
            _drop_device(_op_key(op))
            return ("the kernel wrote outside its buffers, into the harness's own copy of the inputs "
                    "or the reference")
    return None


# Every buffer a check hands the kernel sits between two guard bands of a known byte: a
# kernel that writes a little past the end of a buffer (an unmasked tail, an off-by-one
# bound) or before its start would otherwise corrupt the allocator's heap (a crash some
# evaluations later, blamed on another config) or pass unnoticed. On the device, 64 KiB keeps
# every buffer's start as aligned as the allocation (Triton specializes on 16-byte alignment).
# On the host the buffer is also fenced by unmapped pages and its inputs made read-only
# (tuner/exec/fence.py): a store further out, or any write to an input, faults.
_GUARD_BYTES = 65536
_GUARD_BYTE = 0xA5


class _Guarded(NamedTuple):
    view: Any    # the contiguous tensor the kernel gets
    buf: Any     # the bytes it sits in, bands included
    head: int    # bytes of band before it
    fence: Any   # the FencedBuffer on the host, else None


def _guarded(backend, shape, dtype, device) -> _Guarded:
    import torch
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type == "cpu":
        from tuner.backends.fence import BAND_BYTES
        fb = backend.host_buffer(n)
        buf = torch.frombuffer(fb.raw, dtype=torch.uint8)
        buf.fill_(_GUARD_BYTE)
        return _Guarded(buf[BAND_BYTES:BAND_BYTES + n].view(dtype).view(shape), buf, BAND_BYTES, fb)
    buf = torch.full((n + 2 * _GUARD_BYTES,), _GUARD_BYTE, dtype=torch.uint8, device=device)
    return _Guarded(buf[_GUARD_BYTES:_GUARD_BYTES + n].view(dtype).view(shape), buf, _GUARD_BYTES, None)


def _stray_write(g: _Guarded, name: str) -> str | None:
    """Where and how far a kernel wrote outside its buffer into the guard bands; None if not."""
    size = g.view.element_size()
    end = g.head + g.view.numel() * size
    head = (g.buf[:g.head] != _GUARD_BYTE).nonzero()
    tail = (g.buf[end:] != _GUARD_BYTE).nonzero()
    if len(tail):
        return f"past the end of {name} (as far as {int(tail.max()) // size + 1} element(s) beyond it)"
    if len(head):
        return f"before the start of {name} (as far as {(g.head - int(head.min()) + size - 1) // size} element(s) before it)"
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
    pristine, ref_dev = _device_set(backend, op, seed, ref)
    bufs = _BufferSet(backend, op, pristine, ref_dev)
    refused = _launch_once(backend, kernel, bufs)
    return (refused, 0.0, 0.0) if refused else bufs.verdict()


def _launch_once(backend, kernel, bufs: "_BufferSet") -> str | None:
    """One checked call on `bufs`, waited for; why it was refused (host compute, a declared
    cost the kernel exceeds), or None."""
    try:
        backend.launch_checked(kernel, bufs.args)
    except Refused as e:
        return str(e)
    backend.sync()
    return None


def _check_reference_after(backend, kernel, op: Op, seed: int, scale: float = 1.0) -> tuple[str | None, float, float]:
    """A check whose reference does not exist while the kernel runs. On a GPU a kernel can read
    any device memory: the references of the pooled sets sit there, and a kernel that found
    the one for its inputs could copy it instead of computing. Here the inputs are new, the
    outputs are allocated from the op's shapes, and the float64 reference is made from the
    untouched inputs after the kernel has returned. `scale`: floating inputs multiplied by it
    (the range check), the tolerance then torch's own error on such inputs."""
    bufs = _unreferenced_set(backend, op, seed, scale)
    refused = _launch_once(backend, kernel, bufs)
    if refused:
        return refused, 0.0, 0.0
    _make_reference(backend, op, bufs)
    return bufs.verdict()


RANGE_SCALE = 16.0  # a power of two: the scaled inputs are exact, no new rounding
# The range check looks for a kernel that breaks there (non-finite outputs, an overflow, a
# result off by its own magnitude), not for one that rounds otherwise than torch where the op
# grows ill-conditioned with its inputs' scale (attention's scores: 256x larger at 16x q and k,
# whose rounding exp turns into relative error): its tolerances are as many times wider as
# its inputs are larger (an output that grows with them grows its rounding error alike).
RANGE_LOOSENESS = RANGE_SCALE


def _range_check(backend, kernel, op: Op) -> str | None:
    """Why the kernel is wrong on inputs RANGE_SCALE times larger than the checks' where torch's
    own implementation is right, or None (also where it is not: see `torch_slack`)."""
    seed = _rng.randrange(1, 2**31)
    why, _, _ = _check_reference_after(backend, kernel, op, seed, RANGE_SCALE)
    return (f"{why} (on inputs scaled by {RANGE_SCALE:g}, half the rows whole and outliers in the "
            f"others, seed {seed}: a range torch's own "
            f"implementation in {op.spec.dtype} computes right: a kernel must be right there too, "
            f"e.g. subtract the row max before exp, accumulate in a type that does not overflow)"
            if why else None)


RANGE_OUTLIERS = 1 / 32  # the share of elements scaled in a row that is not scaled whole


def _scaled(xs: list, scale: float, seed: int) -> list:
    """`xs` with their floating elements times `scale` (exactly: a power of two) where the range
    check puts them: every element of half the rows (the last dim), chosen at random, and in
    the other rows one element in 32 at random places, as outlier features are. A kernel that
    looks at a few elements of a row to tell this check from the others (and takes its shortcut
    where they look small) misses the outliers; a whole scaled row overflows what a narrow
    accumulator holds."""
    if scale == 1.0:
        return xs
    import torch
    g = torch.Generator(device=xs[0].device if xs else "cpu").manual_seed(seed)
    for x in xs:
        if x.is_floating_point() and x.numel():
            rows = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
            whole = torch.rand(rows.shape[0], 1, generator=g, device=x.device) < 0.5
            picked = whole | (torch.rand(rows.shape, generator=g, device=x.device) < RANGE_OUTLIERS)
            x.mul_(torch.where(picked, scale, 1.0).to(x.dtype).reshape(x.shape))
    return xs


def _unreferenced_set(backend, op: Op, seed: int, scale: float = 1.0) -> "_BufferSet":
    """A buffer set of `seed`'s inputs (floating ones times `scale`) whose reference is not made
    yet (`_make_reference`, once the kernel has run on it): its outputs allocated from the op's
    shapes."""
    import torch

    from tuner.core.ops import arg_specs
    where = backend.data_device()
    host = None if where is not None else _scaled(op.make_inputs(seed), scale, seed)
    xs = (_scaled(op.make_inputs(seed, where), scale, seed) if where is not None
          else [backend.to_device(x.clone()) for x in host])
    if not backend.isolated_kernels:
        for t in xs:
            t._tuner_digest = _digest(t)
    ref_device = xs[0].device if xs else (where or "cpu")  # the outputs go beside the inputs
    _, outs = arg_specs(op)
    placeholders = [torch.empty(shape, dtype=torch.float64 if dt.is_floating_point else dt, device=ref_device)
                    for shape, dt in outs]
    bufs = _BufferSet(backend, op, xs, placeholders, "" if scale == 1.0 else f"x{scale:g}")
    bufs.host_inputs = host
    return bufs


def _make_reference(backend, op: Op, bufs: "_BufferSet") -> None:
    """The reference of an `_unreferenced_set`, from its pristine inputs (digest-checked by the
    verdict: a kernel that wrote into them is caught, not believed)."""
    host = bufs.host_inputs
    on_host = host is not None and getattr(backend, "verify_on_host", False)
    ref = _reference_of(op, bufs.pristine) if host is None else _reference_of(op, host)
    bufs.ref = ref if on_host or host is None else [backend.to_device(r) for r in ref]


class _BufferSet:
    """One set of guarded buffers for the kernel: inputs copied from `pristine`, outputs
    poisoned; `verdict` says whether the last call on them did the work (and poisons the
    outputs again for the next one)."""

    def __init__(self, backend, op: Op, pristine: list, ref_dev: list, kind: str = ""):
        self.op, self.pristine, self.ref, self.kind = op, pristine, ref_dev, kind  # kind: see torch_slack
        self.inputs = [_guarded(backend, x.shape, x.dtype, x.device) for x in pristine]
        for g, x in zip(self.inputs, pristine):
            g.view.copy_(x)
            if g.fence is not None:
                g.fence.read_only()
        # Made where the reference lives, so on the device: no host buffer copied over per check.
        where = pristine[0].device if pristine else None  # the kernel's device (refs may stay on the host)
        self.outs = [_guarded(backend, r.shape, out_dtype(op, r), where or r.device) for r in ref_dev]
        self.host_inputs: list | None = None  # the host's draw, where the reference is made from it
        self.good: list | None = None  # outputs that passed the full check (see verdict)
        self.good_err = (0.0, 0.0)
        self.poison()
        self.args = [g.view for g in self.inputs + self.outs]

    def poison(self, decoys: list | None = None, always: bool = False) -> None:
        """Fill the outputs before the next call: with a random poison, or (half the time,
        or `always`, when given) with `decoys`, another input set's reference, so that a
        stale output looks like a computed one and a kernel that skips work when its output
        already looks done is caught."""
        if decoys is not None and (always or _rng.random() < 0.5):
            self.poisons = [None] * len(self.outs)
            for g, d in zip(self.outs, decoys):
                g.view.copy_(d)
            return
        self.poisons = [_poison(g.view.dtype) for g in self.outs]
        for g, p in zip(self.outs, self.poisons):
            g.view.fill_(p)

    def verdict(self, decoys: list | None = None) -> tuple[str | None, float, float]:
        """Why the last call on this set did not do the work, or None; with the max abs and rel
        error. Outputs bit-identical to ones this set's full check passed are the same right
        answer to the same inputs: one comparison in the output dtype instead of a float64
        pass (which cost ~0.15 s per check at 4M elements on a CPU: 26 s of a 36 s re-timing).
        Anything else gets the full check."""
        import torch
        try:
            touched = _untouched(self.op, self.pristine + self.ref)
            if touched:
                return touched, 0.0, 0.0
            if self.good is not None:
                why = _intact(self.op, self.pristine, self.inputs, self.outs)
                if why is not None:
                    return why, 0.0, 0.0
                if all(torch.equal(g.view, k) for g, k in zip(self.outs, self.good)):
                    return None, *self.good_err
            out = _verdict(self.op, self.pristine, self.ref, self.inputs, self.outs, self.poisons, self.kind)
            if out[0] is None:
                self.good, self.good_err = [g.view.clone() for g in self.outs], out[1:]
            return out
        finally:
            self.poison(decoys)


def _intact(op: Op, pristine: list, inputs: list, outs: list) -> str | None:
    """Why the call wrote where it must not (guard bands, inputs), or None."""
    import torch
    names = [f"input {n}" for n in op.input_names] + [f"output {n}" for n in op.output_names]
    for name, g in zip(names, inputs + outs):
        stray = _stray_write(g, name)
        if stray:
            return f"the kernel wrote {stray}"
    for name, x, g in zip(op.input_names, pristine, inputs):
        if not torch.equal(g.view, x):  # on the device: no copy back
            return f"the kernel wrote to its input {name}"
    return None


def _verdict(op: Op, pristine: list, ref_dev: list, inputs: list, outs: list,
             poisons: list, kind: str = "") -> tuple[str | None, float, float]:
    """Why the outputs in `outs` are not `op`'s result on `pristine` (or the inputs or guard
    bands were written), or None; with the max abs and rel error. `kind`: the inputs' range
    (see torch_slack)."""
    import torch
    why = _intact(op, pristine, inputs, outs)
    if why is not None:
        return why, 0.0, 0.0
    atol, rtol = op.tolerance
    max_abs = max_rel = 0.0
    slack = torch_slack(op, pristine, ref_dev, kind)
    if slack is None:
        return None, 0.0, 0.0  # a range the op's own implementation does not compute right
    loose = RANGE_LOOSENESS if kind else 1.0
    rtol *= loose
    for name, g, r, p, floor in zip(op.output_names, outs, ref_dev, poisons, slack):
        atol = max(op.tolerance[0], floor) * loose
        # Compared where the reference is: on the device with it (no copy back), or on the host
        # for a backend that verifies there (Backend.verify_on_host).
        out = g.view if g.view.device == r.device else g.view.to(r.device)
        o = out.double()
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
            unwritten = int((out == p).logical_and(bad).sum()) if p is not None else 0
            note = (f"; {unwritten} still hold the value the buffer was filled with before the "
                    f"launch (never written)") if unwritten else ""
            raised = (f", raised from {op.tolerance[0]:g} to {SLACK_FACTOR:g}x torch's own error in "
                      f"{op.spec.dtype}") if atol > op.tolerance[0] * loose else ""
            raised += f", {loose:g}x the checks' tolerance at this range" if kind else ""
            return (f"output {name}: {int(bad.sum())} of {o.numel()} elements off; first at {idx}: "
                    f"got {float(o[idx]):.6g}, expected {float(r[idx]):.6g} "
                    f"(atol {atol:g}{raised}, rtol {rtol:g}){note}", max_abs, max_rel)
    return None, max_abs, max_rel


class Caught(Exception):
    """A timed call's outputs (or inputs, or guard bands) showed the work was not done."""


class _Rotation:
    """The buffer sets that timed calls go through (one per pooled seed, up to `n`), in an order
    drawn at random: consecutive calls never see the same buffers, and each set's outputs are
    checked after every chunk of timed calls (`verify`, outside the timed region)."""

    def __init__(self, backend, kernel, op: Op, n: int = 3):
        self.backend, self.kernel = backend, kernel
        pooled = _pooled(op, backend)
        self.sets = [_BufferSet(backend, op, *_device_set(backend, op, seed, ref))
                     for seed, ref in _rng.sample(pooled, min(n, len(pooled)))]
        self.last = -1  # the set of the last call
        self.next: int | None = None  # the set `before` made ready for the next call
        self.calls = 0
        self.used: set[int] = set()  # sets called since the last verify

    def before(self) -> None:
        """Untimed, ahead of each timed call (the backend's `before`): picks the set of the next
        call (any but the last one's) and fills its outputs with a fresh poison. No timed call
        finds the result an earlier call left in its outputs: a kernel that computes a sample
        of its result, finds it already there and skips the rest would otherwise be timed
        skipping, and for a kernel of a few microseconds the history check cannot tell."""
        self.next = self._any_but_last()
        self.sets[self.next].poison()

    def call(self) -> None:
        k, self.next = self.next, None
        self._call(self._any_but_last() if k is None else k)  # None: a warm-up call, not timed

    def _any_but_last(self) -> int:
        return _rng.choice([j for j in range(len(self.sets)) if j != self.last] or [0])

    def _call(self, k: int) -> None:
        self.last = k
        self.calls += 1
        self.used.add(k)
        self.backend.launch(self.kernel, self.sets[k].args)

    def decoy_round(self) -> None:
        """One more call on each set, its outputs holding another set's result: whatever the
        poisons drawn while timing, a kernel that skips work on outputs that look done is
        caught (raises Caught)."""
        n = len(self.sets)
        if n < 2:
            return
        self.backend.sync()
        for k, s in enumerate(self.sets):
            s.poison(self.sets[(k + 1) % n].ref, always=True)
        order = _rng.sample(range(n), n)
        if order[0] == self.last:
            order.reverse()
        for k in order:
            self._call(k)
        self.verify()

    def verify(self) -> None:
        """Raise Caught when a set's last timed call did not do the work."""
        self.backend.sync()
        used, self.used = self.used, set()
        n = len(self.sets)
        for k in sorted(used):
            decoys = self.sets[(k + 1) % n].ref if n > 1 else None
            why, _, _ = self.sets[k].verdict(decoys)
            if why:
                raise Caught(f"a timed call's result was wrong (buffer set {k + 1} of {len(self.sets)}, "
                             f"after {self.calls} timed calls; its checks had passed): {why}")


_CHUNK = 32  # timed repetitions queued before the host waits and checks (on average: drawn per chunk)


def bench(backend, fn: Callable[[], None], settings: Settings, best_s: float | None = None,
          between: Callable[[], None] | None = None,
          before: Callable[[], None] | None = None) -> tuple[list[float], bool]:
    """Raw samples of `fn` in seconds, and whether timing stopped early (clearly slower).
    `between` runs after the warm-up and after every chunk of timed calls, untimed (the
    rotation's checks: it raises to stop); `before` ahead of every timed call, untimed (the
    rotation's poison: see the backends' `time_calls`)."""
    first = backend.time_call(fn, before)  # also a warm-up: first-touch, lazy loading
    t0 = time.perf_counter()
    est = min(first, backend.time_call(fn, before))
    # The budget is wall time: a repetition costs its cache flush and launch too. Sized from
    # the kernel's time alone, a 20 us kernel on the cpu backend (whose flush writes twice the
    # last-level cache, milliseconds) got max_reps repetitions: ~15 s per candidate, ~90 s
    # for the re-timing of a 3-evaluation run.
    per_rep = max(est, time.perf_counter() - t0, 1e-7)
    n_warm = int(min(100, settings.warmup_s / max(est, 1e-7)))
    for _ in range(n_warm):
        fn()
    backend.sync()
    if between is not None:
        between()
    reps = int(max(settings.min_reps, min(settings.max_reps, settings.bench_budget_s / per_rep)))
    samples: list[float] = []
    while len(samples) < reps:
        # In chunks (queued, waited for once): min_reps first, so that a clearly slower
        # candidate stops as early as before, then larger ones.
        chunk = settings.min_reps if not samples else _rng.randint(_CHUNK // 2, _CHUNK * 3 // 2)
        samples.extend(backend.time_calls(fn, min(chunk, reps - len(samples)), before))
        if between is not None:
            between()
        if (best_s is not None and len(samples) >= settings.min_reps
                and statistics.median(samples) > settings.early_stop_factor * best_s):
            return samples, True
        if settings.precision > 0 and len(samples) >= _PRECISE_MIN and precise(samples, settings.precision):
            break
    return samples, False


def _forgiving_one_late_start(what: str, step: Callable[[], Any]) -> Any:
    """`step()` (calls of a kernel: its checks, its timing, its calls on fresh buffers), run once
    more after a pause when its kernel's process began its calls late (ClockMismatch): a loaded
    machine delays a process's wake-up as a kernel that goes on working after it answered does
    (an honest 9 us C kernel's calls began 260 us late on a 2-core machine under a test suite).
    What the first round measured is dropped; only a second late round counts against the
    kernel. A kernel that answers early gains only if it does so on most calls, and then it is
    late in both rounds."""
    try:
        return step()
    except ClockMismatch:
        time.sleep(_LATE_PAUSE_S)
    try:
        return step()
    except ClockMismatch as e:
        raise ClockMismatch(f"{e} (in two rounds of {what})") from None


_LATE_PAUSE_S = 0.1  # between the two rounds: long enough for a passing load to pass


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


def prepare(backend, spec: OpSpec) -> None:
    """Build what the first measurement of `spec` needs before it can check a kernel: the live
    op (a problem file's is drawn and run on the host), its pooled verification sets on the
    device with their references, and torch's own error on one (the tolerance). Sent while the
    model writes, so that its first candidate is timed seconds after it compiles, not after
    all of this (4-5 s at 8192x8192 on an H200)."""
    op = load_op(spec)
    for seed, ref in _pooled(op, backend):
        pristine, ref_dev = _device_set(backend, op, seed, ref)
    torch_slack(op, pristine, ref_dev)
    backend.sync()


def measure(backend, artifact: str, spec: OpSpec, settings: Settings,
            best_s: float | None = None, reference_s: float | None = None,
            floor: tuple[float, str] | None = None) -> Measurement:
    """`floor`: (seconds, what bound they are) under which no honest kernel runs here."""
    op = load_op(spec)
    floor_s, bound = floor if floor else (None, "")
    t0 = time.perf_counter()
    TIMES["measures"] += 1
    try:
        kernel = backend.load(artifact, op)
    except (BackendUnavailable, OutsideKill):
        raise  # the tool's or the machine's failure, not the candidate's
    except Exception as e:
        return Measurement(Status.RUNTIME_ERROR, detail=f"load failed: {type(e).__name__}: {e}"[:2000])
    finally:
        t1 = time.perf_counter()
        TIMES["load_s"] += t1 - t0
    max_abs = max_rel = 0.0
    t2 = None  # when timing began
    try:
        for seed, ref in _rng.sample(_pooled(op, backend), 2):
            why, a, r = _forgiving_one_late_start("checks", lambda: check(backend, kernel, op, seed, ref))
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            if why:
                return Measurement(Status.WRONG_RESULT, max_abs_err=a, max_rel_err=r,
                                   detail=f"{why} (input seed {seed})")
        why = _forgiving_one_late_start("checks", lambda: _range_check(backend, kernel, op))
        if why:
            return Measurement(Status.WRONG_RESULT, max_abs_err=max_abs, max_rel_err=max_rel, detail=why)
        rotation = _Rotation(backend, kernel, op)
        t2 = time.perf_counter()
        samples, stopped = _forgiving_one_late_start(
            "timing", lambda: bench(backend, rotation.call, settings, best_s, rotation.verify, rotation.before))
        rotation.decoy_round()
        TIMES["reps"] += len(samples)
        median = max(statistics.median(samples), 1e-12)  # 0 s is suspect, not a division by zero
        history, retimed = (None, None) if stopped else _forgiving_one_late_start(
            "calls on fresh buffers", lambda: _history(backend, kernel, op, median, rotation))
    except Caught as e:
        return Measurement(Status.WRONG_RESULT, max_abs_err=max_abs, max_rel_err=max_rel, detail=str(e))
    except ClockMismatch as e:
        return Measurement(Status.SUSPECT, max_abs_err=max_abs, max_rel_err=max_rel, detail=str(e))
    except OutsideKill:
        raise  # the machine's failure: the worker reports it, the request is sent once more
    except Exception as e:  # a candidate that raises at run time (e.g. a Triton launch error)
        tb = traceback.format_exception_only(type(e), e)
        return Measurement(Status.RUNTIME_ERROR, detail="".join(tb).strip()[:2000])
    finally:
        t3 = time.perf_counter()
        TIMES["check_s"] += (t2 or t3) - t1
        TIMES["bench_s"] += t3 - t2 if t2 is not None else 0.0
    if history:
        return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel, history)
    detail = f"stopped early: slower than {settings.early_stop_factor:g}x the best" if stopped else ""
    if retimed:
        detail = (f"timed again at the calls on new buffers, which read slower than its {median * 1e6:.1f} us "
                  f"median; so did its calls on the timed buffers there: {statistics.median(retimed) * 1e6:.1f} "
                  f"us median of {len(retimed)}, kept (the machine was slower then, or the kernel was)")
        samples, median = list(retimed), statistics.median(retimed)
    beats = floor_s is not None and median < floor_s
    if beats or (reference_s and median * settings.suspect_speedup < reference_s):
        # Too good to be true until shown otherwise: re-check on inputs never seen before.
        claim = (f"{floor_s / median:.2f}x faster than this device can run it ({bound})" if beats
                 else f"{reference_s / median:.1f}x faster than the reference")
        for _ in range(2):
            seed = _rng.randrange(1, 2**31)
            why, _, _ = check(backend, kernel, op, seed, _reference(op, seed, backend.data_device()))
            if why:
                return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel,
                                   f"{claim}, but on fresh inputs: {why}")
        if beats:
            return Measurement(Status.SUSPECT, tuple(samples), max_abs, max_rel,
                               f"{claim}; correct on fresh inputs, but no kernel beats the hardware: "
                               f"a cheat the checks do not see, or a ceiling measured too low")
        detail = f"{claim}; re-verified on fresh inputs"
    return Measurement(Status.OK, tuple(samples), max_abs, max_rel, detail)


_FRESH_CALLS = 3      # single calls on never-seen inputs, after the timing
_HISTORY_FACTOR = 2.0  # where the backend states none (`Backend.history_factor`)
_HISTORY_S = 20e-6     # absolute slack where the backend states none (`Backend.history_slack_s`)


class _Round(NamedTuple):
    """One history round: the fastest of its lone calls on never-seen buffers, how many there
    were, and the calls on the timed buffers right before them (`_IN_FLOW` before each)."""
    cold: float
    lone: int
    flow: tuple[float, ...]


def _history(backend, kernel, op: Op, median: float,
             rotation: _Rotation) -> tuple[str | None, tuple[float, ...] | None]:
    """(why the kernel's time depends on the calls before it, or None; the samples that replace
    its timed ones, or None). Rounds `_HISTORY_PAUSE_S` apart (other work on the machine can
    hold all of one round's lone calls, which follow each other within milliseconds: an honest
    35 us C kernel read 2 ms three times in a row on a busy CI machine), until one passes (its
    lone calls near the median timed before any round) or two flag (SUSPECT); at most
    `_HISTORY_ROUNDS`. A round whose lone calls were slow and whose calls on the timed buffers
    right before them were as slow (within the factor) does not flag: the machine was slower
    then (an honest C softmax's calls on a 2-core machine read 0.95 and 2.0 ms by turns, whole
    seconds at a time), or the kernel slowed the calls around the check. Either way the timed
    buffers' calls of that round become the kernel's samples when no round passes: a kernel
    that slowed them to be excused is recorded at their time, at least its work on new buffers
    over the factor, which is what it could have gained without the trick."""
    made: list = []  # every set stays alive until the end: later rounds' addresses are new too
    factor = getattr(backend, "history_factor", _HISTORY_FACTOR)
    slack = getattr(backend, "history_slack_s", _HISTORY_S)

    def slower(t: float, than: float) -> bool:
        return t > factor * than and t - than > slack
    flagged: list[_Round] = []
    excused: list[_Round] = []
    for k in range(_HISTORY_ROUNDS):
        if k:
            time.sleep(_HISTORY_PAUSE_S)
        r = _history_round(backend, kernel, op, rotation, made)
        if not slower(r.cold, median):
            return None, None
        # Excused by the factor alone, never the absolute slack: its time is then theirs, and
        # that bounds what it gains (by the slack, a 1 us cheat of 20 us work would be excused).
        (flagged if r.cold > factor * statistics.median(r.flow) else excused).append(r)
        if len(flagged) == 2:
            return (f"{r.cold / median:.1f}x slower on buffers it had never seen ({r.cold * 1e6:.1f} us, the "
                    f"fastest of {r.lone} single calls) than on the buffers it was timed on ({median * 1e6:.1f} us "
                    f"median): its time depends on the calls before it (results kept between calls, or work "
                    f"skipped on buffers seen before); the calls on the timed buffers right before the single "
                    f"ones: {statistics.median(r.flow) * 1e6:.1f} us median (in two rounds, at least "
                    f"{_HISTORY_PAUSE_S:g} s apart)"), None
    return None, min((r.flow for r in excused), key=statistics.median)


_HISTORY_ROUNDS = 4  # at most: until one passes or two flag (rounds the machine's slowness excused in between)
_HISTORY_PAUSE_S = 1.0  # between the history check's rounds: a passing load passes
_IN_FLOW = 3  # calls on the rotation's sets right before each lone call (see _history_round)


def _history_round(backend, kernel, op: Op, rotation: _Rotation, made: list) -> _Round:
    """What a kernel takes on inputs it has never seen (`_history` judges it). Single calls on inputs
    it has never seen (each from a brand-new seed, in new buffers, outputs poisoned, its
    reference made only after the call), timed as the timed calls are and then checked: an
    honest kernel takes about its median; one that skips work on buffers or inputs it has
    seen (a result cache keyed by the inputs, wherever it keeps it: even an uninitialised
    local array that the next call finds where the last one left it), or that copies the
    reference of its inputs from device memory (none exists here while it runs), is fast only
    on the rotation's, and one that skips work here too is wrong here (raises Caught). Pooled seeds would not do: the rotation's
    inputs come from the pool, and a cache keyed by their contents would hit here too.
    A sample in which the device may have waited for the host's launch (the backend's
    `last_call_clean`: a lone call on a loaded machine) may read slow: while fewer than three
    were clean, more fresh sets are made (one more batch), never a second call on the same
    ones (a kernel could answer it from the first); the fastest of all of them is compared.
    Each lone call comes in the flow of timed calls: right after `_IN_FLOW` calls on the
    rotation's sets, as the timed calls follow each other (whether the timed buffers were slow
    at that moment too tells a slow machine from buffers the kernel has not seen; a kernel that
    saw the first lone call's new inputs knows the calls around the next ones and could slow
    them, so they excuse a round only at the price `_history` states). After a pause (the new inputs being
    made) a kernel whose threads another process's work holds off its cores waits for the
    scheduler's next tick: 147 us at 2 ms apart, 8 ms at 5 ms apart (bench/RESULTS.md). The
    calls before it are on buffers the kernel has seen, so they tell it nothing of what comes
    next. Where a kernel can read memory beyond its buffers (a GPU's), each set is made after
    those calls, right before its own: made earlier, its inputs would lie where the calls before
    could find them and compute their result ahead. Where kernels are isolated (a process that
    maps a buffer at its first call), the sets are made first: making one is host work, a
    pause."""
    clean, unclean = [], []
    in_flow: list[float] = []  # the timed buffers' calls right before the lone ones
    ahead = backend.isolated_kernels

    def new_set():
        # Its reference is made after the calls: while it runs, none of these inputs' results
        # exists anywhere a kernel could copy it from (see _check_reference_after).
        return _unreferenced_set(backend, op, _rng.randrange(1, 2**31))

    for _ in range(2):  # a second batch only while too few samples were clean
        n = _FRESH_CALLS - len(clean)
        made.append([new_set() for _ in range(n)] if ahead else [])  # kept: new addresses too
        for k in range(n):
            in_flow += backend.time_calls(rotation.call, _IN_FLOW, rotation.before)
            if not ahead:
                made[-1].append(new_set())
            fresh = made[-1][k]
            t = backend.time_call(lambda: backend.launch(kernel, fresh.args))
            (clean if getattr(backend, "last_call_clean", True) else unclean).append(t)
        for fresh in made[-1]:
            _make_reference(backend, op, fresh)
            why, _, _ = fresh.verdict()
            if why:
                raise Caught(f"a call on buffers it had not seen before was wrong (its checks and timed "
                             f"calls had passed): {why}")
        if len(clean) >= _FRESH_CALLS:
            break
    # Every lone call counts, clean or not: a host's delay only ever adds to a call's time, so
    # the fastest of all is never below what the kernel took. More sets were made only so that
    # enough calls stood a chance of running undelayed.
    return _Round(min(clean + unclean), len(clean + unclean), tuple(in_flow))


class _ReferenceCall:
    """The torch reference as a timed call, cold as a kernel's call is: `before` evicts its
    inputs and its last call's outputs, whose memory the allocator hands the next call's
    outputs (Backend.evict; nothing where time_call flushes the whole cache)."""

    def __init__(self, backend, op, xs: list):
        self.backend, self.op, self.xs = backend, op, xs
        self.inputs = [x for x in xs if hasattr(x, "untyped_storage")]
        self.last: list = []

    def call(self) -> None:
        out = self.op.torch_impl(self.xs)
        self.last = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if hasattr(t, "untyped_storage")]

    def before(self) -> None:
        self.backend.evict(self.inputs + self.last)
        self.last = []


def time_reference(backend, spec: OpSpec, settings: Settings) -> list[float]:
    """Samples of the torch implementation a user would run today, on the same device."""
    op = load_op(spec)
    where = backend.data_device()
    try:
        xs = op.make_inputs(1, where) if where is not None else [backend.to_device(x) for x in op.make_inputs(1)]
        ref = _ReferenceCall(backend, op, xs)
        samples, _ = bench(backend, ref.call, settings, before=ref.before)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if "out of memory" not in str(e).lower():
            raise
        # The first thing a run puts on the device: say what to change, not only what broke.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MemoryError(f"{spec.key}: the inputs and the torch reference at this shape do not fit "
                          f"the device's memory ({first[:300]}); pick a smaller shape") from None
    return samples


def recheck(backend, artifact: str, spec: OpSpec) -> str | None:
    """One more verification on brand-new inputs (for the winner); the reason it fails, or None.
    Its reference is made only after the kernel has run (`_check_reference_after`)."""
    op = load_op(spec)
    kernel = backend.load(artifact, op)
    try:
        # A second round draws new inputs too: none the kernel has been called on.
        why, _, _ = _forgiving_one_late_start(
            "checks", lambda: _check_reference_after(backend, kernel, op, _rng.randrange(1, 2**31)))
    except (OutsideKill, BackendUnavailable):
        raise
    except Exception as e:  # its process died under it (cpu), a launch error
        return f"{type(e).__name__}: {e}"[:2000]
    return why


def round_order(n: int, r: int) -> list[int]:
    """The order of n contenders in round r of an interleave: each round starts one place
    later, so that over n rounds each takes every place once. A place that reads slower (a
    compute-bound kernel timed right after another heats the chip: one attention kernel read
    2298-2408 us by its place) then falls on all alike, where a fixed order hands it to one."""
    return [(r + j) % n for j in range(n)]


RETIMED_SUSPECT = "re-timing, suspect: "  # how time_many's reasons that are not wrong results begin


def retimed_status(reason: str) -> Status:
    """The status a candidate gets for `time_many`'s reason: SUSPECT for a time that depends on
    the calls before it or a clock that did not fit, WRONG_RESULT for wrong re-timed calls."""
    return Status.SUSPECT if reason.startswith(RETIMED_SUSPECT) else Status.WRONG_RESULT


def time_many(backend, artifacts: list[str], spec: OpSpec, settings: Settings,
              rounds: int = 5, with_reference: bool = False) -> list[list[float] | str]:
    """Re-time several candidates interleaved (A B C, B C A, C A B, ...: `round_order`, the
    rounds a multiple of the contenders) so drift and a slower place in the round hit all
    alike (a fixed order handed the slow first place to the search's fastest, always first),
    each on its own rotation of buffer sets, checked as the first timing was.
    A candidate whose re-timed calls are wrong gets the reason instead of samples, and so does
    one whose calls on new buffers after the interleave are slower than its re-timed median
    (`_history`, as after a first timing): a kernel's state can outlive its first measurement
    (a GPU kernel's scratch memory that the caching allocator hands back, in a worker serving
    the whole run), and one honest through its first timing could keep its results from then
    on, for the pooled inputs these rotations reuse.
    `with_reference`: the torch reference is timed in the same interleave, its samples last
    (a speedup measured while the machine was busy then compares like with like)."""
    op = load_op(spec)
    kernels = [backend.load(a, op) for a in artifacts]
    rotations = [_Rotation(backend, k, op) for k in kernels]
    out: list[list[float] | str] = [[] for _ in kernels]
    if with_reference:
        where = backend.data_device()
        xs = op.make_inputs(1, where) if where is not None else [backend.to_device(x) for x in op.make_inputs(1)]
        ref = _ReferenceCall(backend, op, xs)
        out.append([])
    contenders = len(out)
    rounds = -(-rounds // contenders) * contenders  # each place alike; the same time each, in shorter rounds
    short = settings.replace(bench_budget_s=settings.bench_budget_s / rounds, min_reps=3, precision=0.0)
    late: set[int] = set()  # kernels whose process was once seen starting its calls late
    for r in range(rounds):
        for i in round_order(contenders, r):
            if i == len(rotations):  # the reference
                s, _ = bench(backend, ref.call, short, before=ref.before)
                out[-1].extend(s)
                continue
            rot = rotations[i]
            if isinstance(out[i], str):
                continue
            try:
                s, _ = bench(backend, rot.call, short, between=rot.verify, before=rot.before)
                rot.decoy_round()
            except Caught as e:
                out[i] = f"re-timing: {e}"
                continue
            except ClockMismatch as e:
                # A busy machine delays a kernel process's wake-up as a kernel that goes on
                # working after it answered does (a 2-core machine under a test suite: an
                # honest 21 us kernel's calls began 262 us late). This round's samples are
                # dropped; only a second time counts against the kernel.
                if i not in late:
                    late.add(i)
                    continue
                out[i] = f"{RETIMED_SUSPECT}{type(e).__name__}: {e} (twice)"[:2000]
                continue
            except (OutsideKill, BackendUnavailable):
                raise
            except Exception as e:  # its process died under it (cpu), its clock did not fit the judge's
                out[i] = f"re-timing: {type(e).__name__}: {e}"[:2000]
                continue
            out[i].extend(s)
    for i, rot in enumerate(rotations):
        if isinstance(out[i], str) or not out[i]:
            continue
        median = max(statistics.median(out[i]), 1e-12)
        try:
            why, retimed = _forgiving_one_late_start(
                "calls on fresh buffers", lambda: _history(backend, kernels[i], op, median, rot))
        except (OutsideKill, BackendUnavailable):
            raise
        except Caught as e:  # wrong on new buffers
            out[i] = f"re-timing: {e}"
            continue
        except ClockMismatch as e:
            out[i] = f"{RETIMED_SUSPECT}{type(e).__name__}: {e}"[:2000]
            continue
        except Exception as e:  # its process died under it (cpu), a launch error
            out[i] = f"re-timing: {type(e).__name__}: {e}"[:2000]
            continue
        if why:
            out[i] = f"{RETIMED_SUSPECT}{why}"
        elif retimed:
            out[i] = list(retimed)
    return out
