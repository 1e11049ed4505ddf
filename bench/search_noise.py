"""Does the search name a truly good config when timings are noisy, at a user's budget?

Every recorded landscape (bench/landscapes/: the library's skeletons on an H200, searched from
each param's middle value; the landscape JSONs' shapes) is replayed through the real
`tune.run_search` loop with timings drawn around the recorded ones (`tuner.offline.replay.Noise`:
a drift factor per evaluation, per-call jitter and stalls; assumed, since the landscapes hold
one median per config), then a winner is named as `tune.pick_winner` names it: finalists
re-timed in one interleave. Two naming rules side by side: the fastest three (the rule before
`tune.finalists`) and `tune.finalists` (the three fastest plus every other within 5 % or the
medians' standard errors, up to 8). Per landscape, strategy and rule over N seeds: the share
of seeds whose named winner is truly within 3 % and 1 % of the landscape's optimum, the
median and worst true gap of the named winner, the median and p90 evaluations until a config
truly within 3 % was evaluated, and the configs re-timed at the end.

    python bench/search_noise.py [--seeds 20] [--budget 40] [--noise 0.03,0.01] [--jobs 2]
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

from tuner.offline import replay  # noqa: E402

RULES = {"fastest 3": (3, 3, 0.0), "finalists": (3, 8, 0.05)}
SAMPLERS = {"guided": "guided", "tpe": "tpe", "random": "random"}


def one(job: tuple) -> tuple:
    path, shape, sampler, rule, seed, budget, noise, guided, anchor = job
    import warnings
    warnings.simplefilter("ignore")
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    land = load(path, shape, seed)
    options = {"sampler_options": dict(guided)} if sampler == "guided" and guided else {}
    t = replay.replay_search(land, sampler, seed, budget=budget, noise=noise, finalists=RULES[rule],
                             anchor_margin=anchor, **options)
    return (t.named_within(0.03), t.named_within(0.01), t.named_s / t.best_s - 1, t.evaluations_to(0.03), t.retimed,
            t.anchored)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--noise", default="0.03,0.01",
                    help="DRIFT,JITTER (lognormal sigmas), default 0.03,0.01; 'none': the recorded times")
    ap.add_argument("--strategies", default="guided,tpe,random")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--only", help="landscapes whose label contains this")
    ap.add_argument("--rules", default=",".join(RULES), help="naming rules: " + ", ".join(RULES))
    ap.add_argument("--guided", action="append", default=[], metavar="OPTION=VALUE",
                    help="a guided-search option (GuidedOptions), e.g. clip=3")
    ap.add_argument("--anchor", type=float, metavar="MARGIN",
                    help="time configs within MARGIN of the best again against the incumbent in one "
                         "interleave (run_search's anchor_margin; default: off)")
    a = ap.parse_args()
    noise = None if a.noise == "none" else replay.Noise.parse(a.noise)
    import yaml
    guided = tuple((k, yaml.safe_load(v)) for k, v in (o.split("=", 1) for o in a.guided))
    runs = sorted(str(p) for p in (ROOT / "bench" / "landscapes").iterdir() if p.is_dir())
    shared = sorted(str(p) for p in Path("/work/shared/landscapes").glob("*.json")) or \
        sorted(str(p) for p in (ROOT / "tests" / "fixtures" / "landscapes").glob("*.json"))
    lands = [x for x in landscapes(shared, runs, False) if not a.only or a.only in x[0]]
    jobs, keys = [], []
    for label, path, shape in lands:
        for s in a.strategies.split(","):
            for rule in a.rules.split(","):
                for seed in range(a.seeds):
                    jobs.append((path, shape, SAMPLERS[s.strip()], rule, seed, a.budget, noise, guided, a.anchor))
                    keys.append((label, s.strip(), rule))
    t0 = time.monotonic()
    if a.jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(a.jobs) as pool:
            results = pool.map(one, jobs, chunksize=1)
    else:
        results = [one(j) for j in jobs]
    rows: dict[tuple, list] = {}
    for k, r in zip(keys, results):
        rows.setdefault(k, []).append(r)
    print(f"noise: {noise}; budget {a.budget}; {a.seeds} seeds; guided options {dict(guided) or 'default'}; "
          f"anchor margin {a.anchor}\n")
    print("| landscape | strategy | naming | named within 3 % | within 1 % | gap median | gap worst | "
          "evals to 3 % (median / p90) | re-timed | anchored |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (label, s, rule), res in rows.items():
        e3 = [r[3] for r in res]
        print(f"| {label} | {s} | {rule} | {100 * sum(r[0] for r in res) / len(res):.0f} % | "
              f"{100 * sum(r[1] for r in res) / len(res):.0f} % | {100 * statistics.median(r[2] for r in res):.1f} % | "
              f"{100 * max(r[2] for r in res):.1f} % | "
              f"{statistics.median(e3):g} / {pct(e3, 0.9):g} | {statistics.mean(r[4] for r in res):.1f} | "
              f"{statistics.mean(r[5] for r in res):.1f} |")
    print(f"\n{len(jobs)} runs in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
