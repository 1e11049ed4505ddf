"""Feedback: what a search learned, summarised for the proposer (and for people).

`build_feedback(records, space, ...)` reduces a round's records to:

* the best k configs with their median times and % of the roofline ceiling;
* failures grouped by signature (status plus the error's first line with numbers, paths and
  hashes blanked), each with its count, one config and one excerpt, and for resource
  overflows (a space's resource limit, Ascend UB, shared memory) the required vs available;
* params whose best value sits on an edge of their range (a hint to widen it);
* parameter importance over the passing configs (Optuna's importance evaluator, on log time);
* the share of the sampled configs that were invalid (rejected before compiling).

`render(feedback)` is the compact text that goes into the revision prompt; `to_json()` is
what the run keeps (`feedback.json`). `feedback_for_run(store)` builds it for any finished
run directory, so `tuner show --feedback` works for library runs too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from tuner.core.ops import ceiling
from tuner.core.space import Space
from tuner.core.values import Config, Record, Status
from tuner.run.analysis import (MIN_IMPORTANCE_TRIALS, effects, group_failures, importance,  # noqa: F401
                                 round_, signature)

@dataclass(frozen=True)
class Feedback:
    round: int
    skeleton_hash: str
    space_size: int
    evaluated: int  # compiled or attempted (not INVALID)
    invalid: int
    best: tuple[dict[str, Any], ...] = ()  # config, median_s, percent, ceiling
    failures: tuple[dict[str, Any], ...] = ()  # status, signature, count, config, excerpt, required, available
    edges: tuple[dict[str, Any], ...] = ()  # param, value, side, low, high
    importance: tuple[tuple[str, float], ...] = ()
    reference_s: float | None = None
    notes: tuple[str, ...] = field(default=())
    effects: tuple[dict[str, Any], ...] = ()  # param, ratio, fastest, slowest (see tuner.run.analysis.effects)
    compiler_notes: tuple[str, ...] = ()  # what the compiler said of the best kernel's loops

    @property
    def invalid_share(self) -> float:
        total = self.evaluated + self.invalid
        return self.invalid / total if total else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "skeleton_hash": self.skeleton_hash, "space_size": self.space_size,
                "evaluated": self.evaluated, "invalid": self.invalid,
                "invalid_share": round(self.invalid_share, 4), "best": list(self.best),
                "failures": list(self.failures), "edges": list(self.edges),
                "importance": dict(self.importance), "reference_s": self.reference_s,
                "notes": list(self.notes), "effects": list(self.effects),
                "compiler_notes": list(self.compiler_notes)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Feedback":
        return cls(round=d["round"], skeleton_hash=d["skeleton_hash"], space_size=d["space_size"],
                   evaluated=d["evaluated"], invalid=d["invalid"], best=tuple(d.get("best", ())),
                   failures=tuple(d.get("failures", ())), edges=tuple(d.get("edges", ())),
                   importance=tuple(d.get("importance", {}).items()),
                   reference_s=d.get("reference_s"), notes=tuple(d.get("notes", ())),
                   effects=tuple(d.get("effects", ())), compiler_notes=tuple(d.get("compiler_notes", ())))


def build_feedback(records: list[Record], space: Space, *, flops: float | None = None,
                   nbytes: float = 0.0, peaks: dict[str, float] | None = None, dtype: str = "fp32",
                   reference_s: float | None = None, round: int = 1, skeleton_hash: str = "",
                   k: int = 5, check=None, retimed: list[dict] | None = None) -> Feedback:
    """`check`: config -> why it is invalid at this op and device, or None (Space.check with the
    run's context): edge hints leave out values the constraints force. `retimed`: the summary's
    top configs as re-timed side by side ({config, median_s}), which rank first."""
    latest: dict[str, Record] = {}
    for r in records:  # a later record of a config (a failed winner re-check) supersedes
        latest[r.config.key] = r
    recs = list(latest.values())
    ok = sorted((r for r in recs if r.status is Status.OK), key=lambda r: r.seconds)
    # The configs re-timed side by side come first, by those times; the rest by their
    # search-time medians (each timed alone, at its own moment).
    again = {Config.of(x["config"]).key: x["median_s"] for x in retimed or () if x.get("median_s")}
    ranked = sorted((r for r in ok if r.config.key in again), key=lambda r: again[r.config.key])
    ranked += [r for r in ok if r.config.key not in again]
    best = []
    for r in ranked[:k]:
        secs = again.get(r.config.key, r.seconds)
        entry: dict[str, Any] = {"config": r.config.to_json(), "median_s": secs,
                                 "timing": "re-timed side by side" if r.config.key in again else "search"}
        c = ceiling(flops, nbytes, secs, dtype, peaks or {})
        if c:
            entry["percent"], entry["ceiling"] = round_(c["percent"], 2), c["what"]
        if reference_s:
            entry["speedup"] = round_(reference_s / secs, 3)
        best.append(entry)
    failures = group_failures([r for r in recs if r.status not in (Status.OK, Status.INFRA_ERROR)])
    edges = _edges(space, ranked[0], check) if ranked else []
    ranked_params, notes = importance(space, ok)
    return Feedback(round=round, skeleton_hash=skeleton_hash, space_size=space.size,
                    evaluated=sum(r.status is not Status.INVALID for r in recs),
                    invalid=sum(r.status is Status.INVALID for r in recs), best=tuple(best),
                    failures=tuple(failures), edges=tuple(edges), importance=tuple(ranked_params),
                    reference_s=reference_s, notes=tuple(notes), effects=tuple(effects(space, ok)))


def _edges(space: Space, best: Record, check=None) -> list[dict[str, Any]]:
    """Ordered params whose best value is an end of their range, where widening could move it:
    not an integer at 1 or less on the low side (a count or a switch goes no lower), and not a
    value the constraints force (with `check`, config -> why it is invalid or None: one step
    inward, the other params kept, is invalid)."""
    out = []
    cfg = best.config.as_dict()
    for p in space.params:
        if not p.ordered or len(p.values) < 3 or p.name not in cfg:
            continue
        vals = sorted(p.values)
        v = cfg[p.name]
        if v == vals[0] and isinstance(v, int) and not isinstance(v, bool) and v <= 1:
            continue
        if v in (vals[0], vals[-1]) and check is not None:
            why = check(Config.of({**cfg, p.name: vals[1] if v == vals[0] else vals[-2]}))
            if why and not why.startswith("expression error"):  # forced here, not chosen
                continue
        if v in (vals[0], vals[-1]):
            out.append({"param": p.name, "value": v, "side": "low" if v == vals[0] else "high",
                        "low": vals[0], "high": vals[-1]})
    return out


# ---- text ---------------------------------------------------------------------------------

def fmt_s(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    return f"{s * 1e3:.4g} ms" if s >= 1e-4 else f"{s * 1e6:.4g} us"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _cfg(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def render(fb: Feedback, max_groups: int = 8) -> str:
    """The compact text the revision prompt carries."""
    total = fb.evaluated + fb.invalid
    out = [f"Round {fb.round} (skeleton {fb.skeleton_hash or '?'}): {fb.evaluated} configs compiled "
           f"and run out of {fb.space_size} in the space; {fb.invalid} more sampled configs were "
           f"invalid (rejected by constraints or resource limits before compiling): "
           f"{100 * fb.invalid_share:.0f}% of {total} sampled."]
    if fb.reference_s:
        out.append(f"Reference (torch): {fmt_s(fb.reference_s)}.")
    if fb.best:
        out.append("Best configs (median time, % of the roofline ceiling, speedup over the reference; "
                   "those marked * were re-timed side by side at the end, the rest are the search's "
                   "times, each taken alone):")
        for i, b in enumerate(fb.best, 1):
            extra = ""
            if "percent" in b:
                extra += f", {b['percent']:.1f}% of {b['ceiling']}"
            if "speedup" in b:
                extra += f", {b['speedup']:.2f}x"
            mark = "*" if b.get("timing") == "re-timed side by side" else ""
            out.append(f"  {i}. {fmt_s(b['median_s'])}{mark}{extra}: {_cfg(b['config'])}")
    else:
        out.append("No config passed verification.")
    fails = [f for f in fb.failures if f["status"] != "INVALID"]
    invalid = [f for f in fb.failures if f["status"] == "INVALID"]
    if fails:
        out.append("Failures, grouped by error (count, one config, one excerpt):")
        for f in fails[:max_groups]:
            out.append(f"  {f['status']} x{f['count']}: {f['signature']}")
            out.append(f"    e.g. {_cfg(f['config'])}")
            if "required" in f:
                lo, hi = f["required"]
                req = _num(lo) if lo == hi else f"{_num(lo)} to {_num(hi)}"
                out.append(f"    {f['resource']}: required {req}, available {_num(f['available'])}")
            excerpt = f["excerpt"].strip()
            if excerpt and excerpt != f["signature"]:
                out.extend("    | " + ln for ln in excerpt.splitlines()[:6])
        if len(fails) > max_groups:
            out.append(f"  ... and {len(fails) - max_groups} more kinds of failure")
    if invalid:
        out.append("Invalid configs, by the rule that rejected them:")
        for f in invalid[:max_groups]:
            line = f"  x{f['count']}: {f['signature']}"
            if "required" in f:
                lo, hi = f["required"]
                req = _num(lo) if lo == hi else f"{_num(lo)} to {_num(hi)}"
                line = (f"  x{f['count']}: {f['resource']} over the limit: required {req}, "
                        f"available {_num(f['available'])}")
            out.append(line)
    if fb.edges:
        out.append("Params whose best value sits on an edge of their range (consider widening):")
        for e in fb.edges:
            out.append(f"  {e['param']}={e['value']} is the {'smallest' if e['side'] == 'low' else 'largest'} "
                       f"value of [{e['low']} .. {e['high']}]")
    if fb.importance:
        out.append("Parameter importance for time among passing configs (Optuna, sums to 1): "
                   + ", ".join(f"{k} {v:.2f}" for k, v in fb.importance))
    if fb.effects:
        out.append("Effect of each param (the fastest passing config with each of its values; the "
                   "slowest of those over the fastest; near 1.00x: the choice does not matter here):")
        out.extend(f"  {e['param']}: {e['ratio']:.2f}x (fastest with {e['fastest']}, slowest with "
                   f"{e['slowest']}; {e['values']} values seen)" for e in fb.effects)
    if fb.compiler_notes:
        out.append("What the compiler said about the fastest kernel's loops:")
        out.extend(f"  {n}" for n in fb.compiler_notes)
    for n in fb.notes:
        out.append(f"Note: {n}")
    return "\n".join(out)


def feedback_for_run(store) -> Feedback:
    """Feedback for a run directory, from its records, skeleton, op and device."""
    from tuner.core.ops import load_op
    meta = store.meta()
    skeleton = store.skeleton()
    summary = store.read_json("summary.json") or {}
    op = load_op(store.op_spec())
    peaks = dict(meta.device.peaks) if meta.device else {}
    try:  # the context the run's formulas saw (the backend adds CORES, ctype, ...)
        from tuner.backends import get_backend
        from tuner.core.ops import render_context
        backend = get_backend(meta.backend, 0, **dict(meta.backend_options or {}))
        context, limits = {**render_context(op), **backend.render_context(op)}, backend.limits()

        def check(config):
            return skeleton.space.check(config, context, limits)
    except Exception:  # noqa: BLE001 - no backend here: hints are then not filtered by it
        check = None
    fb = build_feedback(store.records(), skeleton.space, flops=op.flops, nbytes=op.bytes, peaks=peaks,
                        dtype=op.spec.dtype, check=check,
                        reference_s=(summary.get("reference") or {}).get("median_s"),
                        round=skeleton.round or 1, skeleton_hash=skeleton.hash,
                        retimed=summary.get("retimed"))
    flags = tuple(f"{flag}: the machine was busy, so these times and speedups may be off"
                  for flag in summary.get("flags") or ())
    if flags:
        fb = dataclasses.replace(fb, notes=(*fb.notes, *flags))
    if fb.best and check is not None and fb.best[0].get("percent", 100.0) < FAR_BELOW_PERCENT:
        fb = dataclasses.replace(fb, compiler_notes=tuple(
            _compiler_notes(backend, skeleton, Config.of(fb.best[0]["config"]), context, store.path)))
    return fb


FAR_BELOW_PERCENT = 50.0  # a best kernel under this % of its roofline gets the compiler's notes


def _compiler_notes(backend, skeleton, config: Config, context: dict, run_dir) -> list[str]:
    """The compiler's report on the best kernel's loops (Backend.compiler_notes), each line
    traced to the template line that wrote it."""
    import tempfile

    from tuner.core.skeleton import SkeletonError, template_line
    try:
        source = skeleton.render(config, context)
    except SkeletonError:
        return []
    with tempfile.TemporaryDirectory(prefix="notes-", dir=run_dir) as wd:
        notes = backend.compiler_notes(source, wd)
    lines = source.splitlines()
    out = []
    for n, why in notes:
        text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
        t, _ = template_line(skeleton.template, text)
        where = f"template line {t}" if t else f"rendered line {n}"
        out.append(f"{where} `{text[:80]}`: {why[:300]}")
    return out
