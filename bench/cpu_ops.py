"""Tuned C/OpenMP kernels vs the torch CPU reference, on this machine, in one run.

For each op: a search with the default sampler (guided) with the given budget, a random search with the same budget, and a
longer TPE search (4x the budget) as the best-known config of the space (the spaces hold
1-20 thousand valid configs: too many for an exhaustive sweep on a CPU in one sitting).
The torch figure is the reference each run times in the same worker (torch eager on the CPU).

    python bench/cpu_ops.py [--budget 40] [--ops softmax,rmsnorm,matmul]
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.core.ops import builtin_spec  # noqa: E402
from tuner.core.settings import Settings  # noqa: E402
from tuner.core.skeleton import library_skeleton  # noqa: E402
from tuner.run.tune import create_run, execute  # noqa: E402

SHAPES = {"softmax": "4096x1024", "rmsnorm": "4096x1024", "layernorm": "4096x1024", "matmul": "1024x1024x1024"}


def one(op: str, sampler: str, budget: int, settings: Settings, seed: int) -> dict:
    spec = builtin_spec(op, SHAPES[op], "fp32")
    store = create_run(settings, spec, "cpu", library_skeleton(op, "c"), sampler, seed=seed,
                       command=f"bench/cpu_ops.py {op} {sampler} {budget}")
    t0 = time.monotonic()
    s = execute(store, settings, budget)
    s["search_wall_s"] = time.monotonic() - t0
    s["run_dir"] = str(store.path)
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--ops", default="softmax,rmsnorm,matmul")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs-dir", default="runs/bench")
    args = ap.parse_args()
    settings = Settings.from_env(runs_dir=args.runs_dir)
    rows = []
    for op in args.ops.split(","):
        tuned = one(op, "guided", args.budget, settings, args.seed)
        rnd = one(op, "random", args.budget, settings, args.seed)
        long = one(op, "guided", 4 * args.budget, settings, args.seed + 1)
        rows.append((op, tuned, rnd, long))
        print(json.dumps({"op": op, "tuned": tuned["best"], "random": rnd["best"], "long": long["best"]},
                         default=str), file=sys.stderr)

    def ms(s):
        return f"{s['best']['median_s'] * 1e3:.3f}" if s.get("best") else "none"

    info = rows[0][1]["device"]
    print(f"\n{info['name']}, {platform.python_version()}, toolchain {info['toolchain']}, "
          f"peaks {info['peaks']}, {time.strftime('%Y-%m-%d')}\n")
    print("| op | shape | torch ms | tuned ms (default sampler, budget) | speedup | % of ceiling | random ms (same budget) "
          "| best of 4x budget ms | tuned / best-known | search wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for op, tuned, rnd, long in rows:
        b = tuned["best"]
        known = min(x["best"]["median_s"] for x in (tuned, rnd, long) if x.get("best"))
        ceil = b.get("ceiling") or {}
        print(f"| {op} | {SHAPES[op]} | {tuned['reference']['median_s'] * 1e3:.3f} | {ms(tuned)} ({args.budget}) | "
              f"{b['speedup_vs_reference']:.2f}x | {ceil.get('percent', 0):.0f} % of {ceil.get('value', 0):g} "
              f"{ceil.get('unit', '')} | {ms(rnd)} | {ms(long)} | {b['median_s'] / known:.2f} | "
              f"{tuned['search_wall_s']:.0f} |")


if __name__ == "__main__":
    main()
