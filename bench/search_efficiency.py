"""How many evaluations each search strategy spends before it holds a near-optimal config.

Every strategy runs through the real `tune.run_search` loop and `Searcher` against recorded
landscapes (`tuner.offline.replay`), as `tune.execute` would drive it: the space's default config is
enqueued first. For each landscape and strategy, over N seeds: the median number of unique
evaluations (failures count, configs the space's formulas reject do not) until a config within
3 % and within 10 % of the landscape's optimum, and the share of seeds that got there within a
budget of 10 % of the space (and within 3 % in `--within` evaluations, 100 by default). A run
stops at its first config within 3 % or at `--cap` evaluations, or the budget when larger. GP
(Optuna's, minutes a run) stops at the budget and runs only on the recorded landscapes whose
budget is at most `--gp-max-budget` (100), and on the generated ones with `--gp-synthetic`.
A median over runs that never got there reads "> cap".

Landscapes: every shape of each landscape JSON given (default: tests/fixtures/landscapes/*.json,
the recorded H200 matmul); the grid runs of the library's own
skeletons under bench/landscapes/ (`tuner tune OP --sampler grid` on an H200: other kernels
than the matmul the JSON holds; searched from each param's middle value, since the library's
defaults are these runs' optima, or from the nearest config the formulas accept when they
reject it, as `tuner tune` does; the budget is 10 % of the configs the space's formulas accept);
plus generated ones (`tuner.replay.synthetic`: smooth, rugged, cliffs, flat; a new instance per
seed).
`guided+warm` is the default strategy warm-started from each *other* shape of the same file
(of the same op, under bench/landscapes/), as `tuner tune --warm-start` does: each one's best
config first (`tuner.warmstart.warm_starts`), and all their timings as the searcher's prior
(`tuner.warmstart.warm_timings`).

    python bench/search_efficiency.py [--seeds 20] [--jobs 2] [--write]

`--write` replaces the "Search efficiency" section of bench/RESULTS.md (other sections are
left as they are).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import yaml

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # small matrices: threads only contend

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.core import landscape as recorded  # noqa: E402
from tuner.core.space import load_space  # noqa: E402
from tuner.offline import replay  # noqa: E402
from tuner.run import warm as warmstart  # noqa: E402

STRATEGIES = {  # name -> (sampler, Searcher options, warm start)
    "random": ("random", {}, False),
    "tpe (categorical)": ("tpe", {"encoding": "categorical"}, False),
    "tpe (ordinal)": ("tpe", {}, False),
    "cmaes (ordinal)": ("cmaes", {}, False),
    "gp (ordinal)": ("gp", {}, False),
    "guided (default)": ("guided", {}, False),
    "guided+warm": ("guided", {}, True),
}


def landscapes(paths: list[str], runs: list[str], synthetic: bool) -> list[tuple[str, str, str | None]]:
    """(label, path or synthetic kind, shape) for every landscape to replay."""
    out = []
    for p in paths:
        for shape in recorded.shapes(p):
            out.append((f"{Path(p).stem} {shape}", p, shape))
    for d in runs:
        out.append((f"{Path(d).name} (middle start)", d, ""))
    if synthetic:
        out += [(f"synthetic {k}", k, None) for k in replay.SYNTHETIC]
    return out


def load(path: str, shape: str | None, seed: int, formulas: tuple | None = None,
         guesses: tuple = ()) -> recorded.Landscape:
    """`formulas`: (space YAML, DTYPE_BYTES, device limits) to replay a landscape JSON, which
    declares none, under a skeleton's constraints and resource formulas (see --formulas).
    `guesses`: partial configs a landscape JSON's space takes as `promising` (see --promising)."""
    if shape is None:
        return replay.synthetic(path, seed)
    land = recorded.load_cached(path, shape or None)
    if shape == "":
        # A run directory of the library's own skeleton: its space's default is the optimum
        # these grid runs found, so the search starts from each param's middle value instead.
        land = dataclasses.replace(land, space=dataclasses.replace(land.space, default=()))
    elif formulas is not None:
        yaml_path, dtype_bytes, limits = formulas
        space = load_space(yaml_path)
        if [(p.name, p.values) for p in space.params] != [(p.name, p.values) for p in land.space.params]:
            raise SystemExit(f"--formulas {yaml_path}: its params must be the landscape's, value for value: "
                             f"{[(p.name, list(p.values)) for p in land.space.params]}")
        dims = [int(v) for v in shape.split("x")]
        if len(dims) != len(space.sizes):
            raise SystemExit(f"--formulas {yaml_path}: sizes {list(space.sizes)} do not match the shape {shape}")
        land = dataclasses.replace(
            land, space=dataclasses.replace(space, params=land.space.params, source=land.space.source,
                                            meta=land.space.meta, default=()),
            context={**dict(zip(space.sizes, dims)), "DTYPE_BYTES": dtype_bytes}, limits=dict(limits))
    if guesses and shape:
        for g in guesses:
            if land.space.complete(dict(g)) is None:
                raise SystemExit(f"--promising: {dict(g)} is not a (partial) config of {path}: "
                                 f"{[(p.name, list(p.values)) for p in land.space.params]}")
        land = dataclasses.replace(land, space=dataclasses.replace(land.space, promising=guesses))
    return land


def read_guesses(path: str) -> tuple:
    """A YAML file whose `promising:` is a list of (partial) configs."""
    data = yaml.safe_load(Path(path).read_text())
    guesses = data.get("promising") if isinstance(data, dict) else None
    if not isinstance(guesses, list) or not all(isinstance(g, dict) for g in guesses):
        raise SystemExit(f"--promising {path}: expected a 'promising:' list of configs")
    return tuple(tuple(sorted(g.items())) for g in guesses)


def valid_configs(land: recorded.Landscape) -> int:
    """Configs the space's formulas accept at the landscape's shape (all of a landscape JSON's:
    it declares no formulas)."""
    check = replay.ReplayEvaluator(land).check
    return sum(check(c) is None for c in land.space.configs())


def _siblings(path: str, runs: list[str]) -> list[str]:
    """The other recorded shapes of a run directory's op (same space), for guided+warm."""
    def op(d: str) -> str:
        try:
            return json.loads((Path(d) / "run.json").read_text())["op"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            return d  # no run.json to tell: a shape of its own
    return [d for d in runs if d != path and op(d) == op(path)]


def one(job: tuple) -> tuple[float, float, float, int]:
    """(evaluations to 3 %, to 10 %, seconds, failed evaluations) for one landscape, strategy
    and seed."""
    path, shape, strategy, seed, cap, runs, formulas, guesses = job
    warnings.simplefilter("ignore")
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    land = load(path, shape, seed, formulas, guesses)
    sampler, options, warm = STRATEGIES[strategy]
    seeds = ()
    if warm:
        if shape == "":
            others = _siblings(path, runs)
        else:
            others = [f"{path}@{s}" for s in recorded.shapes(path) if s != shape] if shape else []
        seeds = warmstart.warm_starts(others, land.space) if others else ()
        if sampler == "guided" and others:
            options = {**options, "sampler_options": {"prior": warmstart.warm_timings(others, land.space)}}
    t0 = time.monotonic()
    trace = replay.replay_search(land, sampler, seed, budget=cap, seeds=seeds, stop_within=0.03,
                                 **options)
    return (trace.evaluations_to(0.03), trace.evaluations_to(0.10), time.monotonic() - t0,
            sum(math.isinf(t) for t in trace.times))


def fmt_median(xs: list[float], cap: int) -> str:
    m = statistics.median(xs)
    return f"> {cap}" if math.isinf(m) else f"{m:g}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    def v(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "absent"
    libs = ", ".join(f"{p} {v(p)}" for p in ("optuna", "numpy", "scipy"))
    return f"{platform.node()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {libs}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "landscapes").glob("*.json"))
    ap.add_argument("--landscape", action="append", help=f"a landscape JSON (default: {default})")
    runs_default = sorted(str(p) for p in (ROOT / "bench" / "landscapes").iterdir() if p.is_dir()) \
        if (ROOT / "bench" / "landscapes").is_dir() else []
    ap.add_argument("--run", action="append",
                    help="a grid run's directory (default: every one under bench/landscapes/)")
    ap.add_argument("--no-runs", action="store_true", help="leave out the recorded run directories")
    ap.add_argument("--no-synthetic", action="store_true", help="only the recorded landscapes")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated, of: " + ", ".join(STRATEGIES))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--gp-seeds", type=int, help="seeds for gp, which is slow (default: --seeds)")
    ap.add_argument("--gp-synthetic", action="store_true",
                    help="run gp on the generated landscapes too (slow: minutes per run)")
    ap.add_argument("--gp-max-budget", type=int, default=100,
                    help="run gp on a recorded landscape only when its budget is at most this "
                         "(default 100: at ~1000 trials a run takes hours)")
    ap.add_argument("--cap", type=int, default=300, help="evaluations at most per run (GP: the budget)")
    ap.add_argument("--within", type=int, default=100,
                    help="also report the share of seeds within 3 %% after this many evaluations")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--formulas", metavar="SPACE.yaml",
                    help="replay the landscape JSONs under this space's constraints and resource formulas "
                         "(its params must be the landscape's; sizes are read from the shape), for every "
                         "strategy: a config they reject costs no evaluation")
    ap.add_argument("--dtype-bytes", type=int, default=2, help="DTYPE_BYTES for --formulas (default 2: bf16)")
    ap.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                    help="a device limit for --formulas' resources, e.g. smem_bytes=232448 (an H200)")
    ap.add_argument("--promising", metavar="FILE.yaml",
                    help="a 'promising:' list of (partial) configs that the landscape JSONs' spaces take, "
                         "as a skeleton's author or a model would write them: tried after the start")
    ap.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    args = ap.parse_args()
    if (args.formulas or args.promising) and args.write:
        ap.error("--write keeps the table of the landscapes as recorded; --formulas and --promising "
                 "print their own")
    guesses = read_guesses(args.promising) if args.promising else ()
    try:
        limits = {k: float(v) for k, v in (item.split("=", 1) for item in args.limit)}
    except ValueError:
        ap.error(f"--limit takes NAME=VALUE (a number), got {args.limit}")
    formulas = (args.formulas, args.dtype_bytes, tuple(limits.items())) if args.formulas else None
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"unknown strategy {s!r}")
    runs = [] if args.no_runs else (args.run or runs_default)
    lands = landscapes(args.landscape or default, runs, not args.no_synthetic)

    jobs, keys = [], []
    for label, path, shape in lands:
        if formulas is not None and shape:
            label += f" under {Path(args.formulas).name}"
        if guesses and shape:
            label += f" with {Path(args.promising).name}"
        budget = max(1, valid_configs(load(path, shape, 0, formulas)) // 10)
        for strategy in strategies:
            if strategy == "guided+warm" and (shape is None or (shape == "" and not _siblings(path, runs))):
                continue  # nothing to warm-start from
            if STRATEGIES[strategy][0] == "gp":
                limit = args.gp_max_budget if shape is not None else (math.inf if args.gp_synthetic else 0)
                if budget > limit:
                    continue  # Optuna's GP asks take seconds each past a few hundred trials
            cap = budget if STRATEGIES[strategy][0] == "gp" else max(budget, args.cap)
            n = args.gp_seeds if STRATEGIES[strategy][0] == "gp" and args.gp_seeds else args.seeds
            for seed in range(n):
                jobs.append((path, shape, strategy, seed, cap, runs, formulas, guesses))
                keys.append((label, strategy, budget, cap))
    t0 = time.monotonic()
    if args.jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(one, jobs, chunksize=1)
    else:
        results = [one(j) for j in jobs]
    wall = time.monotonic() - t0

    rows: dict[tuple, list] = {}
    for key, res in zip(keys, results):
        rows.setdefault(key, []).append(res)
    lines = ["| landscape | strategy | seeds | median evals to 3 % | to 10 % | found ≤ budget (3 %) | (10 %) "
             f"| found ≤ {args.within} evals (3 %) | failed evals / run | s / run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (label, strategy, budget, cap), res in rows.items():
        e3, e10, secs = [r[0] for r in res], [r[1] for r in res], [r[2] for r in res]
        lines.append(f"| {label} (budget {budget}) | {strategy} | {len(res)} | {fmt_median(e3, cap)} | "
                     f"{fmt_median(e10, cap)} | {100 * sum(e <= budget for e in e3) / len(res):.0f} % | "
                     f"{100 * sum(e <= budget for e in e10) / len(res):.0f} % | "
                     f"{100 * sum(e <= args.within for e in e3) / len(res):.0f} % | "
                     f"{statistics.mean(r[3] for r in res):.1f} | {statistics.mean(secs):.2f} |")
    table = "\n".join(lines)
    print(table)
    print(f"\n{len(jobs)} runs in {wall:.0f} s")
    if args.write:
        write_results(table, args, wall)


def write_results(table: str, args, wall: float) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    cmd = "python bench/search_efficiency.py " + shlex.join(sys.argv[1:])
    section = (
        "## Search efficiency\n\n"
        f"{datetime.date.today().isoformat()}, {machine()}; {wall:.0f} s for all runs.\n"
        f"Recorded landscapes replayed through `tune.run_search` (`tuner.replay`), {args.seeds} seeds "
        "each; unique evaluations (failures included) until a config within 3 % / 10 % of the "
        "optimum, the space's default config first (bench/landscapes/ grid runs: each param's "
        "middle value, or the nearest config the formulas accept); budget = 10 % of the configs the space's formulas accept (\"found ≤ "
        f"{args.within} evals\": within 3 % after at most {args.within}); a run stops at "
        f"3 % or {args.cap} evaluations (the budget when larger; gp: at the budget, on the recorded landscapes "
        f"with a budget of at most {args.gp_max_budget}, and on the generated ones with --gp-synthetic); \"failed evals\": evaluations of such "
        "a run that failed (compile, run or resource errors). Synthetic landscapes are a new "
        "instance per seed. `guided+warm`: warm-started from each other shape of the same "
        "landscape file (bench/landscapes/: of the same op), as `tuner tune --warm-start` does: "
        "its best config first, its timings as the searcher's prior.\n\n"
        f"    {cmd}\n\n{table}\n")
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(r"^## Search efficiency\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda m: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
    print(f"wrote the 'Search efficiency' section of {path}")


if __name__ == "__main__":
    main()
