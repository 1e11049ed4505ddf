"""What a run's records say, for the feedback a model gets (tuner.llm.feedback) and the report a
person reads (tuner.run.html): failures grouped by kind, parameter importance, effect sizes."""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

from tuner.core.space import Space
from tuner.core.values import Record

MIN_IMPORTANCE_TRIALS = 8  # fewer passing configs than this say nothing reliable

_OVERFLOWS = (
    (re.compile(r"resource (\w+) = ([\d.e+]+) exceeds the device limit ([\d.e+]+)"), "{0}", 2, 3),
    (re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available", re.I), "UB bits", 1, 2),
    (re.compile(r"out of resource: shared memory, Required: (\d+), Hardware limit: (\d+)", re.I),
     "shared memory bytes", 1, 2),
)


def signature(text: str) -> str:
    """The error's telling line with the incidental parts blanked, so alike errors group."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
    line = re.sub(r"(/[\w.+-]+)+/([\w.+-]+)", r"\2", line)  # paths -> file name
    line = re.sub(r"\b[0-9a-f]{12,}\b", "H", line)
    line = re.sub(r"(?<![A-Za-z_])[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return line[:200]


def round_(x: float, digits: int) -> float:
    return float(f"{x:.{digits}f}") if math.isfinite(x) else x


def group_failures(failed: list[Record]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in failed:
        reason = r.reason or ""
        # A constraint's own text is the signature; its numbers are not incidental.
        sig = reason.strip()[:200] if reason.startswith("constraint failed") else signature(reason)
        g = groups.get((r.status.value, sig))
        if g is None:
            g = groups[(r.status.value, sig)] = {
                "status": r.status.value, "signature": sig, "count": 0, "config": r.config.to_json(),
                "excerpt": "\n".join(reason.strip().splitlines()[:8])[:600]}
        g["count"] += 1
        for rx, what, req_i, avail_i in _OVERFLOWS:
            m = rx.search(reason)
            if m:
                required, available = float(m.group(req_i)), float(m.group(avail_i))
                g["resource"] = what.format(*m.groups())
                g["available"] = available
                lo, hi = g.get("required", [required, required])
                g["required"] = [min(lo, required), max(hi, required)]
                break
    return sorted(groups.values(), key=lambda g: (g["status"] == "INVALID", -g["count"]))


def importance(space: Space, ok: list[Record]) -> tuple[list[tuple[str, float]], list[str]]:
    if len(ok) < MIN_IMPORTANCE_TRIALS:
        return [], [f"importance not computed: {len(ok)} passing configs "
                    f"(needs {MIN_IMPORTANCE_TRIALS})"]
    import optuna

    from tuner.search.searcher import distributions, encode
    varied = [p.name for p in space.params
              if len({repr(r.config.as_dict().get(p.name)) for r in ok}) > 1]
    if not varied:
        return [], ["importance not computed: every passing config has the same values"]
    dists = distributions(space)
    study = optuna.create_study(direction="minimize")
    for r in ok:
        study.add_trial(optuna.trial.create_trial(params=encode(space, r.config), distributions=dists,
                                                  value=math.log10(max(r.seconds, 1e-12))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            imp = optuna.importance.get_param_importances(study, params=varied)
        except (RuntimeError, ValueError) as e:
            return [], [f"importance not computed: {e}"]
    return [(k, round_(float(v), 3)) for k, v in imp.items()], []


def effects(space: Space, ok: list[Record]) -> list[dict[str, Any]]:
    """Per param with two or more values among the passing configs: the fastest config with
    each value, and how much slower the slowest of those is than the fastest (`ratio`). What a
    choice costs even with every other param at its best: a structural switch that matters
    shows here as 2-4x although importance (a model fitted over all configs, where the other
    params' noise dominates) may call it 0.00. Largest first."""
    out = []
    for p in space.params:
        best: dict[str, tuple[float, Any]] = {}
        for r in ok:
            v = r.config.as_dict().get(p.name)
            if repr(v) not in best or r.seconds < best[repr(v)][0]:
                best[repr(v)] = (r.seconds, v)
        if len(best) < 2:
            continue
        fast, slow = min(best.values(), key=lambda x: x[0]), max(best.values(), key=lambda x: x[0])
        out.append({"param": p.name, "ratio": round_(slow[0] / fast[0], 3), "fastest": fast[1],
                    "slowest": slow[1], "values": len(best)})
    return sorted(out, key=lambda e: -e["ratio"])
