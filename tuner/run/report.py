"""What a person reads: the live progress line, the end-of-run table, the list of runs, and a
sweep's live table and summary."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.core.values import Config

# Off a terminal (a log, a pipe) rich would wrap at 80 columns; logs read better unwrapped.
# No markup: text from compilers, users and models is shown as it is ('[/]' would not parse).
console = Console(stderr=False, width=None if sys.stdout.isatty() else 200, markup=False)
err_console = Console(stderr=True, markup=False)
NOISY = 0.5  # an IQR above this share of the median is worth a warning (idle 2-core VM: 3-19 %)
MOVED = 1.5  # a winner re-timed this factor away from its search figure (either way) is worth one too


@dataclass
class Progress:
    """What a progress view shows, updated after every record."""

    budget: int
    evaluations: int = 0
    invalid: int = 0
    repeats: int = 0
    best_s: float | None = None
    best_config: Config | None = None
    failures: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    phase: str = "searching"
    same_failure: tuple[str | None, int] = (None, 0)  # the last failure, how many in a row (none passed)
    stopped: str = ""  # why the search stopped before its budget, when it did (see SAME_FAILURE_STOP)
    anchored: int = 0  # configs timed again against the incumbent in one interleave (run_search)



def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def progress_text(p: Progress) -> str:
    fails = ", ".join(f"{k} {v}" for k, v in sorted(p.failures.items())) or "none"
    elapsed = time.monotonic() - p.started
    best = f"{fmt_time(p.best_s)}" if p.best_s is not None else "-"
    return (f"{p.phase}: {p.evaluations}/{p.budget} evaluated · best {best} · "
            f"failed: {fails} · invalid (not compiled) {p.invalid} · repeats {p.repeats} · "
            f"{elapsed:.0f} s")


class ProgressView:
    """A live status line on a terminal; a line every few seconds elsewhere (logs, CI)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self._status = None

    def __enter__(self):
        if self.enabled and self.tty:
            self._status = err_console.status("starting…")
            self._status.__enter__()
        return self

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        text = progress_text(p)
        if self._status is not None:
            self._status.update(text)
        elif time.monotonic() - self._last > 5 or p.evaluations >= p.budget:
            self._last = time.monotonic()
            print(text, file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self._status is not None:
            self._status.update(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._status is not None:
            self._status.__exit__(*exc)
        return False


def summary_table(s: dict[str, Any], run_dir: str = "") -> Table:
    op = s["op"]
    sizes = " ".join(f"{k}={v}" for k, v in op["sizes"].items())
    dev = s.get("device") or {}
    title = f"{op['name']} [{sizes}] {op['dtype']} on {s['backend']}: {dev.get('name', '?')}"
    if dev.get("simulated"):
        title += " (simulated)"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    best = s.get("best")
    ref = s.get("reference") or {}
    if best:
        t.add_row("best config", " ".join(f"{k}={v}" for k, v in best["config"].items()))
        t.add_row("median time", f"{fmt_time(best['median_s'])} (IQR {fmt_time(best['iqr_s'])}, "
                                 f"{best['samples']} samples)")
        for flag in timing_flags(s):
            t.add_row("timing noisy", f"{flag}: something else was using the device or its cores, so "
                                      f"these times, the speedup and the choice may be off; re-run on an "
                                      f"idle machine")
        rate = f"{best['gbps']:.2f} GB/s"
        if best.get("gflops"):
            rate += f", {best['gflops']:.1f} GFLOP/s"
        t.add_row("achieved", rate)
        c = best.get("ceiling")
        if c:
            t.add_row("% of ceiling", f"{c['percent']:.1f} % of {c['value']:g} {c['unit']} ({c['what']})")
        if best.get("speedup_vs_reference"):
            how = ", timed interleaved with the winner" if ref.get("interleaved") else ""
            slower = ("; torch's own is faster here: an export of it serves torch's at these sizes "
                      "(README, 'Tuning database')" if best["speedup_vs_reference"] < 1.0 else "")
            t.add_row(f"vs {ref.get('what', 'reference')}",
                      f"{best['speedup_vs_reference']:.2f}x (reference {fmt_time(ref.get('median_s'))}{how}){slower}")
    sandbox = s.get("sandbox") or {}
    if sandbox.get("missing"):
        t.add_row("sandbox", "not held on this machine: " + "; ".join(sandbox["missing"])
                  + " (README, 'Threat model')")
    if not best:
        if not s["evaluations"] and s["invalid"]:
            t.add_row("best config", f"none: every config the sampler proposed ({s['invalid']}) broke the "
                                     f"space's constraints; give the space a `default:` that satisfies "
                                     f"them, or loosen them")
        else:
            t.add_row("best config", "none: no config passed verification")
    t.add_row("evaluated", f"{s['evaluations']} of {s['space_size']} configs "
                           f"({s['invalid']} more rejected by constraints, never compiled)")
    fails = {k: v for k, v in s.get("failures", {}).items() if k != "INVALID"}
    if fails:
        for k, v in sorted(fails.items()):
            t.add_row(f"  {k}", f"{v['count']} (e.g. {v['config']}: {v['example']})")
    else:
        t.add_row("failed", "none")
    if s.get("search_stopped"):
        t.add_row("stopped early", s["search_stopped"])
    drift = s.get("drift")
    if drift and drift.get("anchors"):
        measured = (f"{drift['measured']:.1%} between evaluations" if drift.get("measured") is not None
                    else "not yet measured")
        n = drift["anchors"]
        t.add_row("timing drift", f"{measured}, from {n} config{'s' if n != 1 else ''} re-timed against the "
                                  f"best so far (those that timed at most {drift['margin']:.1%} slower than it)")
    t.add_row("wall time", f"{s['wall_s']:.1f} s")
    if run_dir:
        t.add_row("run", run_dir)
    if s.get("report"):
        t.add_row("report", f"{s['report']} (plots; opens offline in a browser)")
    return t


def runs_table(rows) -> Table:
    t = Table(title="runs", title_justify="left")
    t.add_column("run", no_wrap=True)
    for c in ("op", "sizes", "dtype", "backend", "best", "speedup", "evals", "state"):
        t.add_column(c)
    for path, meta, summary in rows:
        op = meta.op
        best = (summary or {}).get("best") or {}
        sp = best.get("speedup_vs_reference")
        shown, evals = fmt_time(best.get("median_s")), str((summary or {}).get("evaluations", "-"))
        if not summary:  # what `tuner show` says of it: the best verified so far, and the count
            shown, evals = _so_far(path)
        t.add_row(str(path), op.name, "x".join(str(v) for _, v in op.sizes),
                  op.dtype, meta.backend, shown, f"{sp:.2f}x" if sp else "-", evals,
                  "finished" if summary else "incomplete (resume with --resume)")
    return t


def _so_far(path) -> tuple[str, str]:
    """(best verified time so far, configs evaluated) of an unfinished run; ("-", "-") when
    its records cannot be read."""
    from tuner.core.values import Status
    from tuner.run.store import Store, StoreError
    try:
        records = Store.open(path).records()
    except (StoreError, OSError, ValueError):
        return "-", "-"
    ok = [r.seconds for r in records if r.status is Status.OK]
    evaluated = sum(1 for r in records if r.status is not Status.INVALID)  # as the summary counts
    return (f"{fmt_time(min(ok))} so far" if ok else "-"), str(evaluated)


# ---- sweeps (tuner.sweeps.execute: TaskState rows) --------------------------------------------------

class _TaskView:
    """The per-task view that `tune.execute` calls; it feeds the one sweep view."""

    def __init__(self, sweep_view: "SweepView", state):
        self.sweep_view, self.state = sweep_view, state

    def __call__(self, p: Progress) -> None:
        self.state.progress = p
        self.sweep_view.update()

    def note(self, text: str) -> None:
        self.state.note = text
        self.sweep_view.update()


class SweepView:
    """One progress view for the whole sweep: a live table on a terminal, a line every few
    seconds elsewhere (logs, CI)."""

    def __init__(self, states: list, enabled: bool = True):  # of tuner.sweeps.TaskState
        self.states, self.enabled = states, enabled
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self._last = 0.0
        self._live = None
        self._lock = threading.Lock()

    def for_task(self, state) -> _TaskView:
        return _TaskView(self, state)

    def __enter__(self):
        if self.enabled and self.tty:
            from rich.live import Live

            self._live = Live(self._table(), console=err_console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)
        return False

    def line(self) -> str:
        counts: dict[str, int] = {}
        evals = 0
        running = []
        for s in self.states:
            counts[s.state] = counts.get(s.state, 0) + 1
            if s.progress:
                evals += s.progress.evaluations
            elif s.summary:
                evals += s.summary.get("evaluations", 0)
            if s.state == "running":
                p = s.progress
                running.append(f"{s.task.op} {s.task.shape} " + (
                    f"{p.evaluations}/{p.budget} best {fmt_time(p.best_s)}" if p else s.note[:40]))
        done = counts.get("done", 0) + counts.get("failed", 0) + counts.get("skipped", 0)
        return (f"sweep: {done}/{len(self.states)} tasks done, {counts.get('running', 0)} running, "
                f"{counts.get('waiting', 0)} waiting · {evals} evaluations · "
                f"{time.monotonic() - self.started:.0f} s" + (" · " + " · ".join(running) if running else ""))

    def _table(self):
        t = Table(title=self.line().split(" · ")[0], title_justify="left")
        for c in ("task", "state", "evaluated", "best", "failed"):
            t.add_column(c)
        for s in self.states:
            p = s.progress
            fails = sum((p.failures if p else {}).values())
            state = s.state if s.state != "running" or p else s.note[:30] or s.state
            if s.state == "waiting" and s.after is not None and s.after.state in ("waiting", "running"):
                state = f"after {s.after.task.op} {s.after.task.shape}"  # its warm start
            t.add_row(f"{s.task.op} {s.task.shape} {s.task.dtype}", state,
                      f"{p.evaluations}/{p.budget}" if p else "-", fmt_time(p.best_s if p else None),
                      str(fails) if p else "-")
        return t

    def update(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._live is not None:
                self._live.update(self._table())
            elif time.monotonic() - self._last > 5:
                self._last = time.monotonic()
                print(self.line(), file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)


def sweep_table(summary: dict, folder: str = "") -> Table:
    t = Table(title=f"sweep {summary['name']} on {summary['backend']} ({summary['executor']} executor): "
                    f"{summary['evaluations']} evaluations in {summary['wall_s']:.0f} s"
                    + (f" · {folder}" if folder else ""), title_justify="left")
    for c in ("op", "shape", "dtype", "state", "evals", "best", "% of ceiling", "vs reference", "failures"):
        t.add_column(c)
    for r in summary["tasks"]:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(r["failures"].items())) or "none"
        pct = f"{r['ceiling_percent']:.1f} %" if r["ceiling_percent"] is not None else "-"
        sp = f"{r['speedup_vs_reference']:.2f}x" if r["speedup_vs_reference"] else "-"
        state = r["state"] if not r["error"] else f"{r['state']}: {r['error'][:60]}"
        if r["state"] == "done" and r["best_s"] is None:
            state = "done: no config passed"
        elif r["state"] == "done" and r.get("warm_start"):
            state = "done, warm"  # started from its op's first task
        t.add_row(r["op"], r["shape"], r["dtype"], state,
                  f"{r['evaluations']}/{r['budget']}" if r["evaluations"] is not None else "-",
                  fmt_time(r["best_s"]), pct, sp, fails)
    return t


def timing_flags(summary: dict) -> list[str]:
    """Why a summary's times (and so its speedup) may be off: a winner or a reference whose
    samples spread wider than NOISY of their median (the machine was busy). Shown by the
    summary table and `tuner show`, given to the model, kept by the tuning database. And a
    winner whose re-timing is more than MOVED times away from its median during the search:
    the load changed between the two (samples tight within each, so the IQR says nothing)."""
    flags = []
    for what, part in (("winner", summary.get("best")), ("reference", summary.get("reference"))):
        if part and part.get("iqr_s") and part.get("median_s") and part["iqr_s"] > NOISY * part["median_s"]:
            flags.append(f"{what} timing noisy: its IQR is {part['iqr_s'] / part['median_s']:.0%} of its median")
    best = summary.get("best") or {}
    if best.get("search_median_s") and best.get("median_s"):
        moved = best["median_s"] / best["search_median_s"]
        if not 1 / MOVED <= moved <= MOVED:
            flags.append(f"winner timing moved: re-timed at {moved:.2f}x its median during the search "
                         f"({best['median_s'] * 1e3:.4g} ms against {best['search_median_s'] * 1e3:.4g} ms)")
    return flags
