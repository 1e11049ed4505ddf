"""The Python API: what the `tuner` command does, from a notebook or a script.

    import tuner
    run = tuner.tune("softmax", shape="4096x1024", dtype="fp32", budget=20)
    run.best_config, run.best["median_s"], run.frame()      # records as a pandas DataFrame
    run.report()                                             # the HTML report's path
    tuner.Run.open("runs/softmax-4096x1024-fp32-cpu-...")   # any run, finished or not

`tune` takes the command's options as keyword arguments (`--time-budget` is `time_budget`,
`--size NAME=VALUE` is `sizes={"NAME": VALUE}`), goes through the very code the command runs
(`tuner.cli.main.tune_from_args`: the same checks, errors, run directory, resume), and raises
what the command would print as an error (`OpError`, `SkeletonError`, `BackendUnavailable`,
... : `tuner.cli.main.USER_ERRORS`). Progress is not shown unless `progress=True`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.run.records import Run, record_row, rows_csv


def _args(command: str, positional: list[str], options: dict[str, Any]):
    """The command's parsed arguments with `options` set by name, as the parser would set them."""
    from tuner.cli.main import _bad_number, parser
    args = parser().parse_args([command, *positional])
    allowed = {k for k in vars(args) if k not in ("fn", "cmd", "command")}
    for name, value in options.items():
        if name not in allowed:
            raise TypeError(f"{command}() got an unknown option {name!r}; options: {', '.join(sorted(allowed))}")
        setattr(args, name, value)
    bad = _bad_number(args)
    if bad:
        raise ValueError(bad.replace("--", "").replace("-", "_"))
    return args


def tune(op: str | Path | None = None, *, shape: str | tuple[int, ...] | None = None,
         sizes: dict[str, int] | None = None, dtype: str = "fp32", progress: bool = False,
         **options: Any) -> Run:
    """Tune `op` (a built-in op's name, or a problem file's path) as `tuner tune` does and
    return the run. `shape`: "4096x1024" or (4096, 1024); `sizes`: a problem file's size
    overrides; other options as the command's long flags with underscores (backend, chip,
    template, space, language, budget, time_budget, sampler, patience, stop_gain, warm_start (a list),
    fresh (True: not from the earlier runs of the same command), seed,
    parallel, storage, study_name, runs_dir, resume (a run directory: continue it), llm,
    llm_base_url, rounds, candidates, repairs, ...)."""
    from tuner.cli.main import tune_from_args
    if isinstance(shape, (tuple, list)):
        shape = "x".join(str(int(v)) for v in shape)
    if isinstance(options.get("warm_start"), (str, Path)):
        options["warm_start"] = [options["warm_start"]]
    opts = {"shape": shape, "size": [f"{k}={v}" for k, v in (sizes or {}).items()], "dtype": dtype,
            "quiet": not progress, **{k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}}
    positional = []
    if op is not None and not options.get("resume"):
        positional = [str(op)]
    args = _args("tune", positional, opts)
    store, _summary = tune_from_args(args)
    return Run(store.path)


def sweep(file: str | Path, *, progress: bool = False, **options: Any) -> dict[str, Any]:
    """Run (or resume) the sweep in `file` as `tuner sweep` does; its summary (the tasks with
    their runs: `Run.open(task["run"])`). Options as the command's long flags (out, backend,
    concurrency, parallel, runs_dir, ...)."""
    from tuner.cli.sweep import sweep_from_args
    args = _args("sweep", [str(file)], {"quiet": not progress, **options})
    return sweep_from_args(args)


def show(path: str | Path) -> Run:
    """The run at `path` (as `tuner show` reads it)."""
    return Run.open(path)


def report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of a run, a multi-round run or a sweep folder; its path."""
    from tuner.run.html import write_report
    return write_report(path, out)


__all__ = ["Run", "record_row", "report", "rows_csv", "show", "sweep", "tune"]
