"""`tuner retune`: re-tune a finished run elsewhere, and its report."""

from __future__ import annotations

import json
import sys
from typing import Any

from tuner.cli.argv import redacted_argv
from tuner.core.ops import parse_sizes
from tuner.core.settings import Settings
from tuner.run.retune import retune


def report_table(report: dict[str, Any]):
    """The side-by-side view of a retune report."""
    from rich.table import Table

    from tuner.run.report import fmt_time
    old, new = report["old"], report["new"]
    sizes = lambda op: "x".join(str(v) for v in op["sizes"].values())  # noqa: E731
    sim = " (simulated)" if new.get("simulated") else ""
    t = Table(title=f"retune: {old['op']['name']} {sizes(old['op'])} on {old['device']} -> "
                    f"{sizes(new['op'])} on {new['device']}{sim}", title_justify="left")
    for c in ("", "config", f"time on {new['device']}"):
        t.add_column(c)
    cfg = lambda c: " ".join(f"{k}={v}" for k, v in (c or {}).items()) or "-"  # noqa: E731
    ow = report["old_winner_on_new"]
    t.add_row("old winner", cfg(old["winner"]),
              fmt_time(ow["median_s"]) if ow["status"] == "OK" else f"{ow['status']}: {ow['reason']}")
    t.add_row("new winner", cfg(report["new_winner"]["config"]), fmt_time(report["new_winner"]["median_s"]))
    gap = report.get("gap")
    if gap:
        t.caption = (f"gap (the cost of not re-tuning): the old winner is {gap['slowdown']:.3f}x the new "
                     f"winner's time ({gap['percent']:+.1f} %); {report['timing']}. On {old['device']} the old "
                     f"winner took {fmt_time(old['median_s'])}. Run: {report['run']}")
    elif report["same_winner"]:
        t.caption = f"the old winner is still the best. Run: {report['run']}"
    else:
        t.caption = f"no gap: the old winner {ow['status']} on the new target. Run: {report['run']}"
    return t


def cmd_retune(args) -> int:
    from tuner.run.report import ProgressView, console
    settings = Settings.from_env(runs_dir=args.runs_dir, run_timeout_s=args.run_timeout,
                                 compile_timeout_s=args.compile_timeout)
    with ProgressView(not args.quiet) as view:
        report = retune(args.run, settings, device=args.device, chip=args.chip, shape=args.shape,
                        sizes=parse_sizes(args.size),
                        budget=args.budget, top=args.top, sampler=args.sampler, seed=args.seed,
                        time_budget_s=args.time_budget, parallel=args.parallel, view=view,
                        command=redacted_argv(sys.argv))
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        console.print(report_table(report))
    return 0


def add_cli(sub) -> None:
    from tuner.search.searcher import SAMPLERS
    r = sub.add_parser("retune", help="re-tune a finished run on another device, chip or shape, "
                                      "warm-started, and report the cost of not re-tuning")
    r.add_argument("run", help="a finished run directory")
    r.add_argument("--device", help="the target: npu:N, cuda:N, cpu, sim:CHIP (default: the run's)")
    r.add_argument("--chip", help="a simulated Ascend chip (sim backend): 910B1, 910B2, 910B3, 910B4, "
                                  "910_93, 310P3, a profile .yaml or CANN's platform_config/<SoC>.ini")
    r.add_argument("--shape", help="another shape of the run's built-in op, e.g. 8192x4096")
    r.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                   help="another size of the run's problem file (a module-level integer constant), "
                        "e.g. --size batch=64; the others stay as the run had them")
    r.add_argument("--budget", type=int, default=40, help="configs to evaluate (default 40)")
    r.add_argument("--top", type=int, default=5, help="old configs tried first, the old winner "
                                                      "first (default 5)")
    r.add_argument("--time-budget", type=float, metavar="SECONDS")
    r.add_argument("--sampler", choices=SAMPLERS, default="guided")
    r.add_argument("--seed", type=int)
    r.add_argument("--parallel", type=int)
    r.add_argument("--runs-dir")
    r.add_argument("--run-timeout", type=float)
    r.add_argument("--compile-timeout", type=float)
    r.add_argument("--json", action="store_true")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=cmd_retune)
