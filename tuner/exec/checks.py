"""The checks of a candidate's results (used by tuner/exec/measure.py, which says what they are
for): the op's pooled verification sets (seeded inputs and their float64 references, kept on
the host and on the device), buffers between guard bands, a set's verdict on a call's outputs
(poisoned before it, compared with the reference within the op's tolerance, inputs and bands
unchanged), one checked call (`check`), a check whose reference is made only after the call
(`check_reference_after`) and the range check on scaled inputs (`range_check`).

Contract: a verdict is a reason (None when the work was done) with the max abs and rel error;
a timed call that was not done raises `Caught`. A failed check drops the op's device copies
(a kernel that stored outside its buffers may have reached them)."""

from __future__ import annotations

import math
import os
import random
from collections import OrderedDict
from typing import Any, NamedTuple

from tuner.backends.base import Refused
from tuner.core.ops import Op, out_dtype
from tuner.core.tolerance import SLACK_FACTOR, poison as _poison, torch_slack

# References are float64 and can be costly (a 4096^3 matmul), so each worker keeps a few
# seeded input sets with their references; every candidate is checked on two of them,
# chosen at random, and a suspiciously fast one on brand-new inputs.
_POOL_SIZE = 4
_pool: OrderedDict[str, list[tuple[int, list]]] = OrderedDict()
_rng = random.SystemRandom()


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


def reference(op: Op, seed: int, device=None) -> list:
    """The float64 reference for a seed's inputs, made on `device` (None: the host)."""
    return reference_of(op, op.make_inputs(seed, device))


_HOST_ONLY: set[str] = set()  # ops whose reference failed on the device: made on the host


def reference_of(op: Op, xs: list) -> list:
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


def pooled(op: Op, backend=None) -> list[tuple[int, list | None]]:
    """The op's pooled seeds with their host references; (seed, None) for a backend that makes
    its sets on its own device (see device_set), where nothing is kept on the host."""
    key = _op_key(op)
    if backend is not None and backend.data_device() is not None:
        if key not in _seeds:
            _seeds[key] = [_rng.randrange(1, 2**31) for _ in range(_POOL_SIZE)]
        return [(s, None) for s in _seeds[key]]
    if key in _pool:
        _pool.move_to_end(key)
        return _pool[key]
    seeds = [_rng.randrange(1, 2**31) for _ in range(_POOL_SIZE)]
    _pool[key] = [(s, reference(op, s)) for s in seeds]

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


def device_set(backend, op: Op, seed: int, ref: list | None) -> tuple[list, list]:
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
        rs = ref if ref is not None else reference_of(op, xs)
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
    pristine, ref_dev = device_set(backend, op, seed, ref)
    bufs = BufferSet(backend, op, pristine, ref_dev)
    refused = _launch_once(backend, kernel, bufs)
    return (refused, 0.0, 0.0) if refused else bufs.verdict()


def _launch_once(backend, kernel, bufs: "BufferSet") -> str | None:
    """One checked call on `bufs`, waited for; why it was refused (host compute, a declared
    cost the kernel exceeds), or None."""
    try:
        backend.launch_checked(kernel, bufs.args)
    except Refused as e:
        return str(e)
    backend.sync()
    return None


def check_reference_after(backend, kernel, op: Op, seed: int, scale: float = 1.0) -> tuple[str | None, float, float]:
    """A check whose reference does not exist while the kernel runs. On a GPU a kernel can read
    any device memory: the references of the pooled sets sit there, and a kernel that found
    the one for its inputs could copy it instead of computing. Here the inputs are new, the
    outputs are allocated from the op's shapes, and the float64 reference is made from the
    untouched inputs after the kernel has returned. `scale`: floating inputs multiplied by it
    (the range check), the tolerance then torch's own error on such inputs."""
    bufs = unreferenced_set(backend, op, seed, scale)
    refused = _launch_once(backend, kernel, bufs)
    if refused:
        return refused, 0.0, 0.0
    make_reference(backend, op, bufs)
    return bufs.verdict()


RANGE_SCALE = 16.0  # a power of two: the scaled inputs are exact, no new rounding
# The range check looks for a kernel that breaks there (non-finite outputs, an overflow, a
# result off by its own magnitude), not for one that rounds otherwise than torch where the op
# grows ill-conditioned with its inputs' scale (attention's scores: 256x larger at 16x q and k,
# whose rounding exp turns into relative error): its tolerances are as many times wider as
# its inputs are larger (an output that grows with them grows its rounding error alike).
RANGE_LOOSENESS = RANGE_SCALE


def range_check(backend, kernel, op: Op) -> str | None:
    """Why the kernel is wrong on inputs RANGE_SCALE times larger than the checks' where torch's
    own implementation is right, or None (also where it is not: see `torch_slack`)."""
    seed = _rng.randrange(1, 2**31)
    why, _, _ = check_reference_after(backend, kernel, op, seed, RANGE_SCALE)
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


def unreferenced_set(backend, op: Op, seed: int, scale: float = 1.0) -> "BufferSet":
    """A buffer set of `seed`'s inputs (floating ones times `scale`) whose reference is not made
    yet (`make_reference`, once the kernel has run on it): its outputs allocated from the op's
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
    bufs = BufferSet(backend, op, xs, placeholders, "" if scale == 1.0 else f"x{scale:g}")
    bufs.host_inputs = host
    return bufs


def make_reference(backend, op: Op, bufs: "BufferSet") -> None:
    """The reference of an `unreferenced_set`, from its pristine inputs (digest-checked by the
    verdict: a kernel that wrote into them is caught, not believed)."""
    host = bufs.host_inputs
    on_host = host is not None and getattr(backend, "verify_on_host", False)
    ref = reference_of(op, bufs.pristine) if host is None else reference_of(op, host)
    bufs.ref = ref if on_host or host is None else [backend.to_device(r) for r in ref]


class BufferSet:
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

