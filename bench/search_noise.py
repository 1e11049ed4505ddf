"""Does the search name a truly good config when timings are noisy, at a user's budget?

Every recorded landscape (bench/landscapes/: the library's skeletons on an H200, searched from
each param's middle value; the landscape JSONs' shapes) is replayed through the real
`tune.run_search` loop with timings drawn around the recorded ones (`tuner.offline.replay.Noise`:
a drift factor per evaluation, per-call jitter and stalls; assumed, since the landscapes hold
one median per config), then a winner is named as `winner.pick_winner` names it: finalists
re-timed in one interleave. Two naming rules side by side: the fastest three (the rule before
`winner.finalists`) and `winner.finalists` (the three fastest plus every other within 5 % or the
medians' standard errors, up to 8). Per landscape, strategy and rule over N seeds: the share
of seeds whose named winner is truly within 3 % and 1 % of the landscape's optimum, the
median and worst true gap of the named winner, the median and p90 evaluations until a config
truly within 3 % (and 1 %) was evaluated, and the configs re-timed at the end.

    python bench/search_noise.py [--seeds 20] [--budget 40] [--noise 0.03,0.01] [--jobs 2]
        [--strategies guided,tpe,random,kt:dual_annealing,...] [--twice] [--synthetic]

`kt:NAME` replays Kernel Tuner's strategy NAME through its cache-file simulation mode under the
same noise (`pip install -e .[bench]`). With guided among the strategies, a last table checks
the search-reliability targets per landscape against the best of the others. `--twice`: each
search is followed by a second run of the same command, warm-started from the first as `tuner
tune` does by default, and by an independent one (`--fresh`). `--synthetic`: the generated
landscapes too, which were never used to tune the search.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from search_efficiency import landscapes, load  # noqa: E402

from tuner.core.values import Status  # noqa: E402
from tuner.offline import replay  # noqa: E402

RULES = {"fastest 3": (3, 3, 0.0), "finalists": (3, 8, 0.05)}
SAMPLERS = {"guided": "guided", "tpe": "tpe", "random": "random"}


def kernel_tuner_trace(land, strategy: str, seed: int, budget: int, noise) -> replay.Trace:
    """One search by Kernel Tuner's `strategy` in its cache-file simulation mode
    (`kernel_tuner.tune_cache`) on the landscape: the cache holds every config that ran, each
    with the median of one evaluation's calls drawn by the same noise model (seeded by `seed`;
    the recorded time when `noise` is None). Kernel Tuner names the fastest it measured. Its
    cache-file mode infers the valid configs from the cache, so it never spends an evaluation
    on one that failed (the tool's searches do)."""
    import json
    import random
    import tempfile

    import kernel_tuner
    names = [p.name for p in land.space.params]
    rng = random.Random(seed)
    cache, true = {}, {}
    for key, o in sorted(land.outcomes.items()):
        if o.status is not Status.OK:
            continue
        d = json.loads(key)
        values = [d[n] for n in names]
        k = ",".join(str(v) for v in values)
        seen_s = statistics.median(noise.samples(o.seconds, rng, noise.factor(rng))) if noise else o.seconds
        cache[k] = {**dict(zip(names, values)), "time": seen_s * 1e3}
        true[k] = o.seconds
    doc = {"device_name": land.device or "replay", "kernel_name": land.name or "kernel", "problem_size": [1],
           "tune_params_keys": names, "tune_params": {p.name: list(p.values) for p in land.space.params},
           "objective": "time", "cache": cache}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    np_state = __import__("numpy").random.get_state()
    __import__("numpy").random.seed(seed)  # its strategies draw from numpy's and Python's global generators
    random.seed(seed)
    try:
        results, _ = kernel_tuner.tune_cache(f.name, strategy=strategy, strategy_options={"max_fevals": budget},
                                             quiet=True, verbose=False)
    finally:
        os.unlink(f.name)
        __import__("numpy").random.set_state(np_state)
    order: list[str] = []
    for r in results:
        if r and "__error__" not in r:
            k = ",".join(str(r[n]) for n in names)
            if k not in order:
                order.append(k)
    named = min(order, key=lambda k: cache[k]["time"])
    return replay.Trace([true[k] for k in order], land.best_s, len(order),
                        named=None, named_s=true[named])


def one(job: tuple) -> tuple:
    path, shape, sampler, rule, seed, budget, noise, guided, anchor, twice, patience, parallel = job
    import warnings
    warnings.simplefilter("ignore")
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    land = load(path, shape, seed)
    if sampler.startswith("kt:"):
        try:
            t = kernel_tuner_trace(land, sampler[3:], seed, budget, noise)
        except Exception as e:  # Kernel Tuner's own error (hybrid_vndx on some spaces): counted, left out
            return f"{type(e).__name__}: {e}"[:200]
        return (t.named_within(0.03), t.named_within(0.01), t.named_s / t.best_s - 1, t.evaluations_to(0.03), 0, 0,
                t.evaluations_to(0.01), len(t.times))
    options = {"sampler_options": dict(guided)} if sampler == "guided" and guided else {}
    if patience:
        options["patience"] = patience
    t = replay.replay_search(land, sampler, seed, budget=budget, noise=noise, finalists=RULES[rule],
                             anchor_margin=anchor, parallel=parallel, **options)
    if twice:
        return same_command_twice(land, t, sampler, seed, budget, noise, RULES[rule], anchor, guided)
    return (t.named_within(0.03), t.named_within(0.01), t.named_s / t.best_s - 1, t.evaluations_to(0.03), t.retimed,
            t.anchored, t.evaluations_to(0.01), len(t.times))


def same_command_twice(land, first, sampler, seed, budget, noise, rule, anchor, guided) -> tuple:
    """The same command run again, as `tuner tune` runs it by default (`warm.earlier_runs`):
    warm-started from the first run (its best timed config tried right after the default; for
    the guided sampler, every median it timed as the prior), under noise of its own; and,
    for comparison, an independent second run (`--fresh`). Per seed: (first named within 3 %,
    second within 3 %, fresh second within 3 %, second and fresh second named at most 1 % slower
    than the first, the second's named time over the first's, the fresh second's)."""
    timed = first.measured_timings()
    best = min((t, c.key, c) for c, t in timed.items() if t is not None)[2]
    again = {"sampler_options": {**dict(guided), "prior": (timed,)}} if sampler == "guided" else {}
    second = replay.replay_search(land, sampler, seed + 100_000, budget=budget, noise=noise, finalists=rule,
                                  anchor_margin=anchor, seeds=(best,), **again)
    fresh = replay.replay_search(land, sampler, seed + 100_000, budget=budget, noise=noise, finalists=rule,
                                 anchor_margin=anchor, **({"sampler_options": dict(guided)} if guided else {}))
    return (first.named_within(0.03), second.named_within(0.03), fresh.named_within(0.03),
            second.named_s <= 1.01 * first.named_s, fresh.named_s <= 1.01 * first.named_s,
            second.named_s / first.named_s, fresh.named_s / first.named_s)


def twice_table(rows: dict) -> None:
    print("| landscape | strategy | first run: named within 3 % | again, from the first: within 3 % | "
          "again, --fresh: within 3 % | at most 1 % slower than the first: again / --fresh | "
          "worst ratio to the first: again / --fresh |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    share = lambda res, i: 100 * sum(r[i] for r in res) / len(res)  # noqa: E731
    for (label, s, _rule), res in rows.items():
        print(f"| {label} | {s} | {share(res, 0):.0f} % | {share(res, 1):.0f} % | {share(res, 2):.0f} % | "
              f"{share(res, 3):.0f} % / {share(res, 4):.0f} % | {max(r[5] for r in res):.3f} / "
              f"{max(r[6] for r in res):.3f} |")
    allr = [r for res in rows.values() for r in res]
    if allr:
        print(f"| all | | {share(allr, 0):.1f} % | {share(allr, 1):.1f} % | {share(allr, 2):.1f} % | "
              f"{share(allr, 3):.1f} % / {share(allr, 4):.1f} % | |")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--noise", default="0.03,0.01",
                    help="DRIFT,JITTER (lognormal sigmas), default 0.03,0.01; 'none': the recorded times")
    ap.add_argument("--strategies", default="guided,tpe,random",
                    help="guided, tpe, random, and kt:NAME for Kernel Tuner's strategy NAME (its cache-file "
                         "simulation; pip install kernel_tuner), e.g. kt:dual_annealing")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--only", help="landscapes whose label contains this")
    ap.add_argument("--twice", action="store_true",
                    help="each search run again as `tuner tune` runs the same command again (warm-started "
                         "from the first) and independently (--fresh): how often the second names a "
                         "winner within 3 %% and no slower than the first")
    ap.add_argument("--synthetic", action="store_true",
                    help="also the generated landscapes (tuner.offline.replay.SYNTHETIC), never used to tune the search")
    ap.add_argument("--rules", default=",".join(RULES), help="naming rules: " + ", ".join(RULES))
    ap.add_argument("--guided", action="append", default=[], metavar="OPTION=VALUE",
                    help="a guided-search option (GuidedOptions), e.g. clip=3")
    ap.add_argument("--anchor", type=lambda x: x if x == "drift" else float(x), metavar="MARGIN",
                    help="time configs within MARGIN of the best again against the incumbent in one "
                         "interleave (run_search's anchor_margin: a fraction, or 'drift', what `tuner "
                         "tune` uses on a device: twice the drift the anchors measured; default: off)")
    ap.add_argument("--patience", type=int, metavar="N",
                    help="stop a search once N evaluations in a row found nothing 0.5 %% faster (as "
                         "`tuner tune --patience`; the budget still caps it)")
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="evaluations in flight, as `tuner tune` keeps one per compile worker (15 on a "
                         "16-CPU machine); replayed in simulated time (tuner.offline.replay.SimulatedFlight: "
                         "each compiles for its recorded time, the one device times them in turn), the "
                         "same every run for a seed (default: 1)")
    a = ap.parse_args()
    if a.parallel > 1 and (a.twice or any(s.strip().startswith("kt:") for s in a.strategies.split(","))):
        raise SystemExit("--parallel replays this tool's searches only, once")
    if a.patience and a.twice:
        raise SystemExit("--patience with --twice is not replayed")
    noise = None if a.noise == "none" else replay.Noise.parse(a.noise)
    if a.twice and any(s.strip().startswith("kt:") for s in a.strategies.split(",")):
        raise SystemExit("--twice replays this tool's searches only (a run's records are its warm start)")
    import yaml
    guided = tuple((k, yaml.safe_load(v)) for k, v in (o.split("=", 1) for o in a.guided))
    runs = sorted(str(p) for p in (ROOT / "bench" / "landscapes").iterdir() if p.is_dir())
    shared = sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "landscapes").glob("*.json"))
    lands = [x for x in landscapes(shared, runs, a.synthetic) if not a.only or a.only in x[0]]
    jobs, keys = [], []
    for label, path, shape in lands:
        for s in a.strategies.split(","):
            for rule in a.rules.split(","):
                for seed in range(a.seeds):
                    sampler = s.strip() if s.strip().startswith("kt:") else SAMPLERS[s.strip()]
                    jobs.append((path, shape, sampler, rule, seed, a.budget, noise, guided, a.anchor, a.twice,
                                 a.patience, a.parallel))
                    keys.append((label, s.strip(), rule))
    t0 = time.monotonic()
    if a.jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(a.jobs) as pool:
            results = pool.map(one, jobs, chunksize=1)
    else:
        results = [one(j) for j in jobs]
    rows: dict[tuple, list] = {}
    crashed: dict[tuple, list] = {}
    for k, r in zip(keys, results):
        (crashed if isinstance(r, str) else rows).setdefault(k, []).append(r)
    print(f"noise: {noise}; budget {a.budget}; patience {a.patience}; in flight {a.parallel}; {a.seeds} seeds; guided options "
          f"{dict(guided) or 'default'}; anchor margin {a.anchor}\n")
    if a.twice:
        twice_table(rows)
        print(f"\n{len(jobs)} runs in {time.monotonic() - t0:.0f} s")
        return
    print("| landscape | strategy | naming | named within 3 % | within 1 % | gap median | gap worst | "
          "evals to 3 % (median / p90) | evals to 1 % | re-timed | anchored | evaluated (mean) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (label, s, rule), res in rows.items():
        e3, e1 = [r[3] for r in res], [r[6] for r in res]
        print(f"| {label} | {s} | {rule} | {100 * sum(r[0] for r in res) / len(res):.0f} % | "
              f"{100 * sum(r[1] for r in res) / len(res):.0f} % | {100 * statistics.median(r[2] for r in res):.1f} % | "
              f"{100 * max(r[2] for r in res):.1f} % | "
              f"{statistics.median(e3):g} / {pct(e3, 0.9):g} | {statistics.median(e1):g} / {pct(e1, 0.9):g} | "
              f"{statistics.mean(r[4] for r in res):.1f} | "
              f"{statistics.mean(r[5] for r in res):.1f} | {statistics.mean(r[7] for r in res):.1f} |")
    for (label, s, rule), errors in crashed.items():
        print(f"\n{s} crashed on {len(errors)} of {a.seeds} seeds at {label} (left out above): {errors[0]}")
    if "guided" in {s for _, s, _ in rows}:
        targets(rows, {k: len(v) for k, v in crashed.items()}, a.seeds)
    print(f"\n{len(jobs)} runs in {time.monotonic() - t0:.0f} s")


def targets(rows: dict, crashed: dict, seeds: int) -> None:
    """Per landscape, the guided search against the others on the search-reliability targets:
    median evaluations to a config truly within 3 % at most half the best other strategy's
    (random aside; a strategy that crashed on half the seeds or more does not count), p90 at
    most 60, never worse than random, the named winner truly within 3 % in at least 95 % of
    seeds. One naming rule: the first given."""
    rule = next(iter(rows))[2]
    by_land: dict[str, dict[str, list]] = {}
    for (label, s, r), res in rows.items():
        if (r == rule or s.startswith("kt:")) and 2 * crashed.get((label, s, r), 0) < seeds:
            by_land.setdefault(label, {}).setdefault(s, res)
    print(f"\nTargets (naming: {rule}): guided's median evaluations to 3 % against the best other's "
          f"(inf counts as larger than any)\n")
    print("| landscape | guided median / p90 | best other (median) | ratio <= 0.5 | p90 <= 60 | "
          "not worse than random | named within 3 % >= 95 % |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    met = [0, 0, 0, 0]
    for label, by in by_land.items():
        g = [r[3] for r in by["guided"]]
        gm, g90 = statistics.median(g), pct(g, 0.9)
        others = {s: statistics.median(r[3] for r in res) for s, res in by.items() if s not in ("guided", "random")}
        best = min(others.items(), key=lambda kv: kv[1]) if others else ("-", math.inf)
        ratio = gm <= 0.5 * best[1] if math.isfinite(gm) else False
        rnd = statistics.median(r[3] for r in by["random"]) if "random" in by else math.inf
        not_worse = gm <= rnd
        named = sum(r[0] for r in by["guided"]) / len(by["guided"])
        checks = [ratio, g90 <= 60, not_worse, named >= 0.95]
        met = [m + c for m, c in zip(met, checks)]
        yes = ["yes" if c else "no" for c in checks]
        print(f"| {label} | {gm:g} / {g90:g} | {best[0]} {best[1]:g} | {yes[0]} | {yes[1]} | {yes[2]} | "
              f"{yes[3]} ({100 * named:.0f} %) |")
    n = len(by_land)
    print(f"| met on | | | {met[0]} of {n} | {met[1]} of {n} | {met[2]} of {n} | {met[3]} of {n} |")


if __name__ == "__main__":
    main()
