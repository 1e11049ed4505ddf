"""What a person reads: the live progress line, the end-of-run table, the list of runs."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from .tune import Progress

# Off a terminal (a log, a pipe) rich would wrap at 80 columns; logs read better unwrapped.
console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


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
        rate = f"{best['gbps']:.2f} GB/s"
        if best.get("gflops"):
            rate += f", {best['gflops']:.1f} GFLOP/s"
        t.add_row("achieved", rate)
        c = best.get("ceiling")
        if c:
            t.add_row("% of ceiling", f"{c['percent']:.1f} % of {c['value']:g} {c['unit']} ({c['what']})")
        if best.get("speedup_vs_reference"):
            t.add_row(f"vs {ref.get('what', 'reference')}",
                      f"{best['speedup_vs_reference']:.2f}x (reference {fmt_time(ref.get('median_s'))})")
    else:
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
    t.add_row("wall time", f"{s['wall_s']:.1f} s")
    if run_dir:
        t.add_row("run", run_dir)
    return t


def runs_table(rows) -> Table:
    t = Table(title="runs", title_justify="left")
    t.add_column("run", no_wrap=True)
    for c in ("op", "sizes", "dtype", "backend", "best", "speedup", "evals", "state"):
        t.add_column(c)
    for path, meta, summary in rows:
        op = meta.get("op", {})
        best = (summary or {}).get("best") or {}
        sp = best.get("speedup_vs_reference")
        t.add_row(str(path), op.get("name", "?"), "x".join(str(v) for v in op.get("sizes", {}).values()),
                  op.get("dtype", "?"), meta.get("backend", "?"), fmt_time(best.get("median_s")),
                  f"{sp:.2f}x" if sp else "-", str((summary or {}).get("evaluations", "-")),
                  "finished" if summary else "incomplete (resume with --resume)")
    return t
