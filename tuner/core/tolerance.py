"""The checks' tolerances and poison, shared by the harness (tuner/exec/measure.py) and the
backends that check outputs themselves (the sim's metered programs): the value an output holds
before a launch, and the error an honest kernel may have beyond the op's tolerance."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.core.ops import Op

_rng = random.SystemRandom()


def poison(dtype, finite: bool = False):
    """What an output holds before a launch, so that an element never written shows; drawn at
    random each time (a fixed pattern is one a kernel can test for): for floats NaN half the
    time (never with `finite`), else a random finite value far outside any softmax or norm;
    for integers a random value of the dtype's range; for bool either. `finite`: where what
    was written is told from what was not by the poison alone (a run of a sample of a
    kernel's programs), since a kernel that writes NaN would read as one that wrote nothing."""
    import torch
    if dtype.is_floating_point or dtype.is_complex:
        if not finite and _rng.random() < 0.5:
            return float("nan")
        return _rng.choice((-1.0, 1.0)) * _rng.uniform(1e3, 6e4)  # fits fp16 and bf16
    if dtype == torch.bool:
        return _rng.random() < 0.5
    info = torch.iinfo(dtype)
    return _rng.randint(info.min, info.max)


SLACK_FACTOR = 8.0
_slack: dict[str, list[float]] = {}


def torch_slack(op: "Op", pristine: list, ref: list, kind: str = "") -> list[float] | None:
    """Per output, the abs error a kernel is allowed besides the dtype's tolerance:
    SLACK_FACTOR x the largest error of torch's own implementation in the op's dtype (what a
    user runs today) against the float64 reference, measured once per op and `kind` of inputs
    ("": the checks' draw; "x16": scaled by 16, the range check) on a set of that kind. A
    sum, a scan or a dot product over thousands of fp32 terms is off by more than the fixed
    1e-5 in places (cancellation), in torch as in any honest kernel; a kernel that skips
    work, or computes in a narrower type to go faster, is off by orders more. 0 for integer
    outputs, and where torch's implementation cannot run on these inputs. For a scaled kind,
    None where torch's own output on this set is not finite (or the reference is not): a range
    the op does not compute in this dtype, held to nothing (judged per set); and the
    error allowed is at least SLACK_FACTOR x how far torch's own output moves when every input
    moves by one unit in its last place: where an op grows ill-conditioned at that range
    (attention: scores 256x larger at 16x q and k, a near tie of two keys decided by one
    rounding), an honest kernel that rounds an intermediate in the dtype is off by that much."""
    import torch
    key = op.spec.key + op.spec.source + kind
    impl = op.torch_call or op.torch_impl
    if kind:  # each set: whether this draw is in the op's range (scaled rows differ per draw)
        try:
            with torch.no_grad():
                own = impl([x.clone() for x in pristine])
            if not all(bool(torch.isfinite(r).all()) and bool(torch.isfinite(g).all())
                       for g, r in zip(own, ref) if r.is_floating_point()):
                return None
        except Exception:  # noqa: BLE001 - a torch implementation that cannot run here
            return None
    if key not in _slack:
        out: list[float] | None = [0.0] * len(op.output_names)
        try:
            with torch.no_grad():
                got = impl([x.clone() for x in pristine])  # in-place ops
                shaken = impl([one_ulp_off(x) for x in pristine]) if kind else got
            for i, (g, h, r) in enumerate(zip(got, shaken, ref)):
                if r.is_floating_point() and g.shape == r.shape:
                    g = g.to(r.device, torch.float64)
                    if kind and not (bool(torch.isfinite(r).all()) and bool(torch.isfinite(g).all())):
                        out = None
                        break
                    err = (g - r).abs().nan_to_num(0.0, 0.0, 0.0)
                    if kind:
                        err = torch.maximum(err, (h.to(r.device, torch.float64) - g).abs().nan_to_num(0.0, 0.0, 0.0))
                    out[i] = SLACK_FACTOR * float(err.max()) if err.numel() else 0.0
        except Exception:  # noqa: BLE001 - a torch implementation that cannot run here
            out = None if kind else out
        if out is None:
            return None  # not kept: another draw may be in range
        _slack[key] = out
    return _slack[key]


def one_ulp_off(x):
    """A copy of `x` with each floating element moved one unit in its last place, up or down at
    random (an integer tensor: a copy)."""
    import torch
    if not x.is_floating_point():
        return x.clone()
    g = torch.Generator(device=x.device).manual_seed(_rng.randrange(2**31))
    up = torch.rand(x.shape, generator=g, device=x.device) < 0.5
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    try:
        return torch.nextafter(x, torch.where(up, inf, -inf))
    except RuntimeError:  # a dtype without nextafter on this device
        eps = torch.finfo(x.dtype).eps
        return (x.double() * torch.where(up, 1 + eps, 1 - eps)).to(x.dtype)
