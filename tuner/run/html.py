"""`tuner report`: one self-contained HTML file for a run, a multi-round run or a sweep.

Everything comes from what the run directory holds (records.jsonl, summary.json, run.json,
the skeleton, each round's feedback), so a report can be written for any run, finished or
not, on any machine, and again later. plotly.js is embedded: the file opens offline.

What a page shows (each section only where there is something to show):
- the headline: the winner, its time, its ceiling, its speedup over the reference;
- best-so-far against evaluations and against wall time, every evaluation a point;
- every evaluation's time against each param (a log axis for a pow2 range);
- parameter importance (Optuna's, over the passing configs) next to effect sizes (the
  fastest config with each value of a param: the cost of a choice, which importance can miss);
- failures by kind with their messages;
- the winner on a roofline (the device's measured copy bandwidth and matmul rate);
- a multi-round run: each round's skeleton as a diff from the one before, what the model was
  told, and that round's search; a sweep: a table of tasks linking to each task's report.
"""

from __future__ import annotations

import difflib
import html
import json
import math
import time
from pathlib import Path
from typing import Any

from tuner.core.values import Record, Status
from tuner.run.store import Store, StoreError

REPORT_NAME = "report.html"


class ReportError(StoreError):
    """A folder that is not a run, a multi-round run or a sweep."""


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of the run, multi-round run or sweep at `path` to `out` (default:
    report.html inside it) and return where. A sweep's tasks get their own reports too."""
    path = Path(path)
    if (path / "sweep.json").is_file():
        page = _sweep_page(path)
    elif (path / "run.json").is_file():
        store = Store.open(path)
        page = _rounds_page(store) if store.meta().is_rounds else _run_page(store)
    else:
        raise ReportError(f"{path}: not a run directory (no run.json) or a sweep folder (no sweep.json)")
    target = Path(out) if out else path / REPORT_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target


def write_profile_report(title: str, rows: list[dict], out: str | Path) -> Path:
    """A model profile's page (`tuner profile --report`): each operator instance's share of the
    model's time and what a tuned kernel could save at best (Amdahl), as bars, then the table.
    `rows`: `tuner profile --json`'s rows, hottest first."""
    import plotly.graph_objects as go
    top = rows[:30]
    labels = [f"{i}. {r['op'].split('::')[-1]} {r['shapes']}" for i, r in enumerate(top, 1)]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=labels, x=[100 * r["share"] for r in top], orientation="h", name="share of the time",
                         marker_color="#7aa6d6"))
    fig.add_trace(go.Bar(y=labels, x=[100 * (r["could_save"] or 0) for r in top], orientation="h",
                         name="could save at best", marker_color="#d62728"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="% of the model's time")
    fig.update_layout(barmode="group", height=200 + 28 * len(top))
    table = _table(["#", "op", "input shapes", "dtype", "calls", "time per forward", "share", "bound/call",
                    "could save", "library op"],
                   [[i, r["op"], r["shapes"], r["dtypes"], r["calls"], _fmt_s(r["total_s"]), f"{r['share']:.1%}",
                     _fmt_s(r["bound_s"]), "-" if r["could_save"] is None else f"{r['could_save']:.1%}",
                     f"{r['library']['op']} {r['library']['shape']}" if r["library"] else "-"]
                    for i, r in enumerate(rows, 1)])
    page = _page(title, [f"<h2>Where the time goes</h2>{_figure(fig, 'profile')}", f"<h2>Every operator instance</h2>{table}"])
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target


def report_at_end(store: Store, summary: dict, enabled: bool, note=None) -> dict:
    """At the end of a run (`Settings.report`): write its report and name it in the summary
    (and summary.json). A report is never worth a run: where it cannot be written, `note` says
    why and the run ends as it would have (`tuner report` can write it later)."""
    if not enabled:
        return summary
    try:
        target = write_report(store.path)
    except Exception as e:  # noqa: BLE001 - see above
        if note is not None:
            note(f"report.html not written: {type(e).__name__}: {e}")
        return summary
    summary = {**summary, "report": str(target)}
    store.write_json("summary.json", summary)
    return summary


# ---- pieces -------------------------------------------------------------------------------

def _e(x: Any) -> str:
    return html.escape(str(x))


def _fmt_s(s: float | None) -> str:
    if s is None or not isinstance(s, (int, float)) or not math.isfinite(s):
        return "-"
    if s >= 1.0:
        return f"{s:.3g} s"
    return f"{s * 1e3:.4g} ms" if s >= 1e-4 else f"{s * 1e6:.4g} us"


def _cfg(d: dict | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (d or {}).items()) or "-"


def _table(head: list[str], rows: list[list[Any]], raw: set[int] = frozenset()) -> str:
    """An HTML table; cells at positions in `raw` are HTML already."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c if i in raw else _e(c)}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _figure(fig, name: str) -> str:
    fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=40, b=50))
    return f'<div class="figure" data-figure="{_e(name)}">' + fig.to_html(
        full_html=False, include_plotlyjs=False, config={"displaylogo": False}) + "</div>"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
.note { color: #666; font-size: 0.9em; } .diff td { font-family: monospace; font-size: 0.8em; }
.diff_add { background: #e6ffe6; } .diff_chg { background: #ffffcc; } .diff_sub { background: #ffe6e6; }
"""


def _page(title: str, sections: list[str]) -> str:
    from plotly.offline import get_plotlyjs
    made = time.strftime("%Y-%m-%d %H:%M:%S")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<h1>{_e(title)}</h1><p class='note'>written {made} by tuner report</p>"
            + "".join(sections) + "</body></html>\n")


# ---- one run ------------------------------------------------------------------------------

def _ordered(records: list[Record]) -> list[Record]:
    """The evaluations in the order they finished (configs rejected by the formulas, which
    cost nothing, left out)."""
    return sorted((r for r in records if r.status is not Status.INVALID), key=lambda r: r.time)


def _headline(store: Store, summary: dict) -> str:
    meta = store.meta()
    best = summary.get("best") or {}
    ceiling = best.get("ceiling") or {}
    device = summary.get("device") or {}
    rows = [["op", meta.op.key], ["backend", f"{meta.backend} on {device.get('name') or (meta.device.name if meta.device else '?')}"],
            ["skeleton", f"{(meta.skeleton or {}).get('name', '')} ({(meta.skeleton or {}).get('hash', '')})"],
            ["sampler", f"{meta.sampler}, seed {meta.seed}"]]
    if best:
        rows += [["best config", _cfg(best.get("config"))],
                 ["median time", f"{_fmt_s(best.get('median_s'))} (IQR {_fmt_s(best.get('iqr_s'))}, "
                                 f"{best.get('samples', '?')} samples)"]]
        if ceiling:
            rows.append(["% of ceiling", f"{ceiling['percent']:.1f} % of {ceiling['value']:.4g} {ceiling['unit']} "
                                         f"({ceiling['what']})"])
        if best.get("speedup_vs_reference"):
            ref = summary.get("reference") or {}
            rows.append([f"vs {ref.get('what', 'reference')}", f"{best['speedup_vs_reference']:.2f}x "
                                                                 f"(reference {_fmt_s(ref.get('median_s'))})"])
        rows.append(["memcheck", best.get("memcheck", "-")])
    elif summary:
        rows.append(["best config", "none passed"])
    else:
        rows.append(["state", "unfinished (no summary.json yet): what the records say so far"])
    if summary:
        rows += [["evaluated", f"{summary.get('evaluations')} of {summary.get('space_size')} configs "
                               f"({summary.get('invalid', 0)} more rejected by the formulas)"],
                 ["wall time", f"{summary.get('wall_s', 0):.1f} s"]]
        if summary.get("stopped"):
            rows.append(["stopped", summary["stopped"]])
    rows.append(["run", str(store.path)])
    flags = summary.get("flags") or []
    return _table(["", ""], rows) + "".join(f"<p class='note'>{_e(f)}</p>" for f in flags)


def _progress_figure(evals: list[Record]) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=("by evaluation", "by wall time"))
    t0 = evals[0].time
    best, xs, ys, walls = math.inf, [], [], []
    for i, r in enumerate(evals, 1):
        best = min(best, r.seconds)
        if math.isfinite(best):
            xs.append(i)
            walls.append(r.time - t0)
            ys.append(best)
    ok = [(i, r) for i, r in enumerate(evals, 1) if r.status is Status.OK]
    hover = [_cfg(r.config.as_dict()) for _, r in ok]
    for col, x_ok, x_best in ((1, [i for i, _ in ok], xs), (2, [r.time - t0 for _, r in ok], walls)):
        fig.add_trace(go.Scatter(x=x_ok, y=[r.seconds for _, r in ok], mode="markers", name="evaluation",
                                 text=hover, marker=dict(size=6, color="#7aa6d6"), showlegend=col == 1),
                      row=1, col=col)
        fig.add_trace(go.Scatter(x=x_best, y=ys, mode="lines", line_shape="hv", name="best so far",
                                 line=dict(color="#d62728"), showlegend=col == 1), row=1, col=col)
    fig.update_yaxes(type="log", title_text="median time (s)")
    fig.update_xaxes(title_text="evaluation", row=1, col=1)
    fig.update_xaxes(title_text="seconds since the first evaluation", row=1, col=2)
    fig.update_layout(height=380)
    return _figure(fig, "progress")


def _params_figure(space, ok: list[Record]) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    params = [p for p in space.params if len({repr(r.config.as_dict().get(p.name)) for r in ok}) > 1]
    if not params:
        return ""
    cols = min(3, len(params))
    rows = math.ceil(len(params) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[p.name for p in params])
    for k, p in enumerate(params):
        row, col = k // cols + 1, k % cols + 1
        values = [r.config.as_dict().get(p.name) for r in ok]
        x = values if p.ordered else [str(v) for v in values]
        fig.add_trace(go.Scatter(x=x, y=[r.seconds for r in ok], mode="markers", showlegend=False,
                                 text=[_cfg(r.config.as_dict()) for r in ok], marker=dict(size=6)),
                      row=row, col=col)
        if p.ordered and p.log and min(p.values) > 0:
            fig.update_xaxes(type="log", row=row, col=col)
        elif not p.ordered:
            fig.update_xaxes(type="category", categoryorder="array",
                             categoryarray=[str(v) for v in p.values], row=row, col=col)
    fig.update_yaxes(type="log")
    fig.update_layout(height=300 * rows)
    return _figure(fig, "params")


def _importance_section(space, ok: list[Record]) -> str:
    from tuner.run.analysis import effects as effects_of
    from tuner.run.analysis import importance as importance_of
    importance, notes = importance_of(space, ok)
    effects = effects_of(space, ok)
    out = ""
    if importance:
        import plotly.graph_objects as go
        fig = go.Figure(go.Bar(x=[v for _, v in importance], y=[k for k, _ in importance], orientation="h"))
        fig.update_layout(height=120 + 30 * len(importance), yaxis=dict(autorange="reversed"),
                          xaxis_title="importance for log time (Optuna, sums to 1)")
        out += _figure(fig, "importance")
    out += "".join(f"<p class='note'>{_e(n)}</p>" for n in notes)
    if effects:
        out += ("<p>Effect sizes: for each param, the fastest config with each of its values; the slowest "
                "of those against the fastest (what the choice costs with every other param at its best).</p>"
                + _table(["param", "slowest / fastest", "fastest value", "slowest value", "values seen"],
                         [[e["param"], f"{e['ratio']:.2f}x", e["fastest"], e["slowest"], e["values"]]
                          for e in effects]))
    return out


def _failures_section(records: list[Record]) -> str:
    from tuner.run.analysis import group_failures
    groups = group_failures([r for r in records if r.status not in (Status.OK,)])
    if not groups:
        return "<p>No config failed.</p>"
    rows = [[g["status"], g["count"], f"<pre>{_e(g['excerpt'])}</pre>", _e(_cfg(g["config"]))] for g in groups]
    return _table(["status", "configs", "message (first of the kind)", "e.g. config"], rows, raw={2, 3})


def _roofline_section(summary: dict, meta) -> str:
    best = summary.get("best") or {}
    secs = best.get("median_s")
    peaks = dict((summary.get("device") or {}).get("peaks") or (dict(meta.device.peaks) if meta.device else {}))
    flops, nbytes = summary.get("flops"), summary.get("bytes")
    if not secs or not nbytes or not peaks.get("copy_gbps"):
        return ""
    import plotly.graph_objects as go
    bw = peaks["copy_gbps"]
    dtype = meta.op.dtype
    key = f"{dtype}_gflops" if peaks.get(f"{dtype}_gflops") else "fp32_gflops"
    compute = peaks.get(key)
    fig = go.Figure()
    if flops:
        ai = flops / nbytes
        lo, hi = min(ai / 10, 0.1), max(ai * 10, 1000.0)
        grid = [lo * (hi / lo) ** (k / 60) for k in range(61)]
        roof = [min(bw * x, compute) if compute else bw * x for x in grid]
        fig.add_trace(go.Scatter(x=grid, y=roof, mode="lines", name=f"roof: {bw:.4g} GB/s copy"
                                 + (f", {compute:.4g} GFLOP/s {key.split('_')[0]} matmul" if compute else "")))
        fig.add_trace(go.Scatter(x=[ai], y=[flops / secs / 1e9], mode="markers", name="the winner",
                                 marker=dict(size=12, color="#d62728")))
        fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved)")
        fig.update_yaxes(type="log", title_text="GFLOP/s")
    else:  # no FLOP count: the winner against the bandwidth it could reach
        fig.add_trace(go.Bar(x=["the winner", "copy bandwidth (measured)"], y=[nbytes / secs / 1e9, bw],
                             name="GB/s"))
        fig.update_yaxes(title_text="GB/s")
    fig.update_layout(height=380)
    return _figure(fig, "roofline")


def _run_sections(store: Store, level: int = 2) -> list[str]:
    h = f"h{level}"
    meta = store.meta()
    summary = store.read_json("summary.json") or {}
    records = store.records()
    evals = _ordered(records)
    ok = [r for r in evals if r.status is Status.OK]
    space = store.skeleton().space
    out = [f"<{h}>Summary</{h}>" + _headline(store, summary)]
    if ok:
        out.append(f"<{h}>Best so far</{h}>" + _progress_figure(evals))
        out.append(f"<{h}>Time against each param</{h}>" + (_params_figure(space, ok) or
                                                          "<p>Every passing config has the same values.</p>"))
        out.append(f"<{h}>Which params matter</{h}>" + _importance_section(space, ok))
    else:
        out.append("<p>No evaluation has passed yet.</p>")
    out.append(f"<{h}>Failures</{h}>" + _failures_section(records))
    roof = _roofline_section(summary, meta)
    if roof:
        out.append(f"<{h}>The winner against the device's ceilings</{h}>" + roof)
    return out


def _run_page(store: Store) -> str:
    meta = store.meta()
    return _page(f"tuner run {meta.id}: {meta.op.key} on {meta.backend}", _run_sections(store))


# ---- several rounds -----------------------------------------------------------------------

def _skeleton_text(store: Store) -> str:
    parts = []
    for p in sorted((store.path / "skeleton").glob("*")):
        if p.suffix in (".yaml", ".j2") and p.is_file():
            parts.append(f"# ---- {p.name}\n" + p.read_text(errors="replace"))
    return "\n".join(parts)


def _rounds_page(store: Store) -> str:
    meta = store.meta()
    summary = store.read_json("summary.json") or {}
    rounds = sorted(p for p in (store.path / "rounds").glob("*") if (p / "run.json").is_file())
    sections = []
    rows = []
    for p in rounds:
        s = Store(p).read_json("summary.json") or {}
        best = s.get("best") or {}
        rows.append([p.name, s.get("evaluations", "-"), _fmt_s(best.get("median_s")), _cfg(best.get("config"))])
    sections.append("<h2>Rounds</h2>" + _table(["round", "evaluated", "best", "config"], rows))
    if summary.get("winner_round") is not None:
        sections.append(f"<p>The winner across rounds: round {_e(summary['winner_round'])}"
                        f" ({_e(_fmt_s((summary.get('best') or {}).get('median_s')))}).</p>")
    before = ""
    for p in rounds:
        rs = Store(p)
        sections.append(f"<h2>Round {_e(p.name)}</h2>")
        proposal = rs.read_json("proposal.json") or {}
        if proposal.get("phases"):
            sections.append("<p class='note'>phases (s from the model's reply): " + _e(", ".join(
                f"{k} {v}" for k, v in proposal["phases"].items())) + "</p>")
        now = _skeleton_text(rs)
        if before:
            diff = difflib.HtmlDiff(wrapcolumn=90).make_table(before.splitlines(), now.splitlines(),
                                                              "previous round", p.name, context=True,
                                                              numlines=2)
            sections.append(f"<h3>The skeleton, changed from the round before</h3><div class='diff'>{diff}</div>")
        else:
            sections.append(f"<h3>The skeleton</h3><pre>{_e(now)}</pre>")
        before = now
        told = p / "feedback.txt"
        if told.is_file():
            sections.append(f"<h3>What the model was told after this round</h3><pre>{_e(told.read_text())}</pre>")
        sections += _run_sections(rs, level=3)
    return _page(f"tuner run {meta.id}: {meta.op.key} on {meta.backend}, {len(rounds)} round(s)", sections)


# ---- a sweep ------------------------------------------------------------------------------

def _sweep_page(folder: Path) -> str:
    sweep = json.loads((folder / "sweep.json").read_text())
    summary = Store(folder).read_json("summary.json") or {}
    rows = []
    for t in summary.get("tasks") or []:
        run = t.get("run")
        link = "-"
        if run and (Path(run) / "run.json").is_file():
            try:
                target, written = Path(run) / REPORT_NAME, Path(run) / "summary.json"
                if not (target.is_file() and written.is_file()
                        and target.stat().st_mtime >= written.stat().st_mtime):
                    target = write_report(run)  # none yet, or older than the task's summary
                link = f"<a href='{_e(_relative(target, folder))}'>report</a>"
            except (OSError, StoreError, ValueError) as e:  # one broken task does not stop the page
                link = _e(f"no report: {e}")
        pct = t.get("ceiling_percent")
        rows.append([_e(t.get("task")), _e(t.get("state")), _e(_fmt_s(t.get("best_s"))),
                     _e(f"{pct:.1f} %" if pct is not None else "-"),
                     _e(f"{t['speedup_vs_reference']:.2f}x" if t.get("speedup_vs_reference") else "-"),
                     _e(t.get("evaluations")), _e(_cfg(t.get("best_config"))),
                     _e(", ".join(f"{k} {v}" for k, v in (t.get("failures") or {}).items()) or "-"), link])
    table = _table(["task", "state", "best", "% of ceiling", "vs reference", "evaluated", "best config",
                    "failures", ""], rows, raw=set(range(9)))
    note = "" if summary else "<p class='note'>unfinished: no summary.json yet</p>"
    return _page(f"tuner sweep {sweep.get('name', folder.name)} on {sweep.get('backend', '?')}",
                 [note, "<h2>Tasks</h2>", table])


def _relative(target: Path, folder: Path) -> str:
    import os
    return os.path.relpath(target, folder)
