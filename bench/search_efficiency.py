"""How many evaluations each search strategy spends before it holds a near-optimal config.

Every strategy runs through the real `tune.run_search` loop and `Searcher` against recorded
landscapes (`tuner.replay`), as `tune.execute` would drive it: the space's default config is
enqueued first. For each landscape and strategy, over N seeds: the median number of unique
evaluations (failures count, configs the space's formulas reject do not) until a config within
3 % and within 10 % of the landscape's optimum, and the share of seeds that got there within a
budget of 10 % of the space (and within 3 % in `--within` evaluations, 100 by default). A run stops at its first config within 3 % or at `--cap`
evaluations (GP: at the budget, and only on the recorded landscapes unless --gp-synthetic:
it takes minutes a run); a median over runs that never got there reads "> cap".

Landscapes: every shape of each landscape JSON given (default: /work/shared/landscapes/*.json
when present, else the copy in tests/fixtures/landscapes/), plus generated ones
(`tuner.replay.synthetic`: smooth, rugged, cliffs, flat; a new instance per seed).
`guided+warm` is the default strategy warm-started with the best config of each *other*
shape of the same file (`tuner.replay.warm_starts`), as `tuner tune --warm-start` does.

    python bench/search_efficiency.py [--seeds 20] [--jobs 2] [--write]

`--write` replaces the "Search efficiency" section of bench/RESULTS.md (other sections are
left as they are).
"""

from __future__ import annotations

import argparse
import datetime
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

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # small matrices: threads only contend

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner import replay  # noqa: E402

STRATEGIES = {  # name -> (sampler, Searcher options, warm start)
    "random": ("random", {}, False),
    "tpe (categorical)": ("tpe", {"encoding": "categorical"}, False),
    "tpe (ordinal)": ("tpe", {}, False),
    "cmaes (ordinal)": ("cmaes", {}, False),
    "gp (ordinal)": ("gp", {}, False),
    "guided (default)": ("guided", {}, False),
    "guided+warm": ("guided", {}, True),
}


def landscapes(paths: list[str], synthetic: bool) -> list[tuple[str, str, str | None]]:
    """(label, path or synthetic kind, shape) for every landscape to replay."""
    out = []
    for p in paths:
        for shape in replay.shapes(p):
            out.append((f"{Path(p).stem} {shape}", p, shape))
    if synthetic:
        out += [(f"synthetic {k}", k, None) for k in replay.SYNTHETIC]
    return out


def load(path: str, shape: str | None, seed: int) -> replay.Landscape:
    if shape is None:
        return replay.synthetic(path, seed)
    return replay.load_cached(path, shape)


def one(job: tuple) -> tuple[float, float, float, int]:
    """(evaluations to 3 %, to 10 %, seconds, failed evaluations) for one landscape, strategy
    and seed."""
    path, shape, strategy, seed, cap = job
    warnings.simplefilter("ignore")
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    land = load(path, shape, seed)
    sampler, options, warm = STRATEGIES[strategy]
    seeds = ()
    if warm:
        others = [f"{path}@{s}" for s in replay.shapes(path) if s != shape] if shape else []
        seeds = replay.warm_starts(others, land.space) if others else ()
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
    return f"{platform.node()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = sorted(str(p) for p in Path("/work/shared/landscapes").glob("*.json")) or \
        sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "landscapes").glob("*.json"))
    ap.add_argument("--landscape", action="append", help=f"a landscape JSON (default: {default})")
    ap.add_argument("--no-synthetic", action="store_true", help="only the recorded landscapes")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated, of: " + ", ".join(STRATEGIES))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--gp-seeds", type=int, help="seeds for gp, which is slow (default: --seeds)")
    ap.add_argument("--gp-synthetic", action="store_true",
                    help="run gp on the generated landscapes too (slow: minutes per run)")
    ap.add_argument("--cap", type=int, default=300, help="evaluations at most per run (GP: the budget)")
    ap.add_argument("--within", type=int, default=100,
                    help="also report the share of seeds within 3 %% after this many evaluations")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    args = ap.parse_args()
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"unknown strategy {s!r}")
    lands = landscapes(args.landscape or default, not args.no_synthetic)

    jobs, keys = [], []
    for label, path, shape in lands:
        size = load(path, shape, 0).space.size
        budget = max(1, size // 10)
        for strategy in strategies:
            if strategy == "guided+warm" and shape is None:
                continue
            if STRATEGIES[strategy][0] == "gp" and shape is None and not args.gp_synthetic:
                continue  # minutes per run at a 240-config budget: recorded landscapes only
            cap = budget if STRATEGIES[strategy][0] == "gp" else max(budget, args.cap)
            n = args.gp_seeds if STRATEGIES[strategy][0] == "gp" and args.gp_seeds else args.seeds
            for seed in range(n):
                jobs.append((path, shape, strategy, seed, cap))
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
        "optimum, the space's default config first; budget = 10 % of the space (\"found ≤ "
        f"{args.within} evals\": within 3 % after at most {args.within}); a run stops at "
        f"3 % or {args.cap} evaluations (gp: at the budget, and on the recorded landscapes only "
        "unless --gp-synthetic); \"failed evals\": evaluations of such "
        "a run that failed (compile, run or resource errors). Synthetic landscapes are a new "
        "instance per seed. `guided+warm`: warm-started with the best config of each other "
        "shape of the same landscape file.\n\n"
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
