"""`tuner sweep`: run a sweep file."""

from __future__ import annotations

import shlex
import sys

from tuner.cli import NO_WINNER
from tuner.core.settings import Settings
from tuner.run.store import Store
from tuner.sweeps.execute import run_sweep
from tuner.sweeps.plan import load_plan


def add_cli(sub) -> None:
    s = sub.add_parser("sweep", help="tune ops x shapes x dtypes from a sweep file (resumable)",
                       description="Run every task of a sweep file; re-run the same command to resume. "
                                   "Sweep file format: see tuner/sweeps/plan.py or the README, 'Sweeps'.",
                       epilog="exit code: 0 every task passed a config; 3 every task ran and one or more "
                              "passed none; 1 a task failed, was skipped or interrupted; 2 bad input")
    s.add_argument("file", help="the sweep file (YAML)")
    s.add_argument("--out", help="the sweep folder (default: the file's `out:`, else sweeps/<name>)")
    s.add_argument("--backend", help="override the file's backend")
    s.add_argument("--executor", choices=("local", "ray"), default="local")
    s.add_argument("--ray-address", metavar="ADDR", help="a running Ray cluster (default: start a local one)")
    s.add_argument("--devices", type=int, help="device actors with --executor ray (default: every GPU/NPU)")
    s.add_argument("--concurrency", type=int, help="tasks at once with --executor ray "
                   "(default: devices + 1, or one per 4 CPUs when that is more)")
    s.add_argument("--parallel", type=int, help="evaluations in flight per task")
    s.add_argument("--run-timeout", type=float, help="seconds to verify and time one config")
    s.add_argument("--compile-timeout", type=float, help="seconds to compile one config")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.add_argument("--quiet", action="store_true", help="no progress output")
    s.set_defaults(fn=cmd_sweep)


def cmd_sweep(args) -> int:
    import json as _json

    from tuner.run.report import console, sweep_table
    summary = sweep_from_args(args)
    if args.json:
        print(_json.dumps(summary, indent=1, default=str))
    else:
        console.print(sweep_table(summary, summary.get("folder", "")))
        if summary.get("report"):
            print(f"report: {summary['report']}")
    # As `tuner tune`: 1 when a task did not finish (failed, skipped, interrupted), else
    # NO_WINNER when a finished task passed no config, else 0.
    if not all(r["state"] == "done" for r in summary["tasks"]):
        return 1
    return 0 if all(r["best_s"] is not None for r in summary["tasks"]) else NO_WINNER


def sweep_from_args(args) -> dict:
    """What `tuner sweep` does with its parsed arguments (also `tuner.api.sweep`'s): the
    sweep's summary, with the sweep folder under "folder"."""
    settings = Settings.from_env(run_timeout_s=args.run_timeout, compile_timeout_s=args.compile_timeout)
    plan = load_plan(args.file, args.backend)
    folder = plan.folder(args.out)
    if not args.quiet:
        print(f"sweep {plan.name}: {len(plan.tasks)} tasks on {plan.backend} in {folder} "
              f"({args.executor} executor)", file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    with Store(folder).lock():  # two sweeps into one folder would run every task twice at once
        args.resume_hint = shlex.join(["tuner", *sys.argv[1:]])  # what Ctrl-C or an error says to run again
        summary = run_sweep(plan, settings, args.executor, args.ray_address, args.devices, args.concurrency,
                            args.out, not args.quiet, parallel=args.parallel)
    return {**summary, "folder": str(folder)}
