"""Re-tuning for a new chip revision, between two simulated Ascend chips.

For each case: tune the op's triton_ascend skeleton on chip A (the full pipeline: workers,
verification, the default guided sampler, `--budget` evaluations), then `tuner retune` that run
on chip B with the same budget, warm-started with A's best configs. The table shows the old
winner's time on B, the new winner's, and the gap (the cost of not re-tuning); and, as ground
truth, the model's whole landscape on both chips (every config modelled statically), so one can
see whether the searches found the optima. Every time is the simulator's, not a measurement.

    python bench/sim_retune.py                      # the cases below, budget 30
    python bench/sim_retune.py --budget 20 --cases softmax
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.backends.ascend_model import Estimate  # noqa: E402
from tuner.backends.sim import model_space  # noqa: E402
from tuner.core.ops import builtin_spec  # noqa: E402
from tuner.core.settings import Settings  # noqa: E402
from tuner.core.skeleton import library_skeleton  # noqa: E402
from tuner.run.retune import retune, with_backend_options  # noqa: E402
from tuner.run.tune import create_run, execute  # noqa: E402

CASES = {  # name: (op, shape, dtype, chip A, chip B)
    "softmax": ("softmax", "96x32768", "fp32", "910B2", "910B4"),  # a 32k-vocab softmax over 96 rows
    "rmsnorm": ("rmsnorm", "2000x5120", "bf16", "910B2", "910B4"),
    "rope": ("rope", "1024x32x128", "bf16", "910B2", "310P3"),
}


def landscape(op, shape, dtype, chip):
    return {c.key: e.seconds for c, e in model_space(op, shape, dtype, chip) if isinstance(e, Estimate)}


def run_case(name, budget, runs_dir, seed):
    op, shape, dtype, chip_a, chip_b = CASES[name]
    settings = Settings.from_env(runs_dir=runs_dir, bench_budget_s=0.01, warmup_s=0.0)
    t0 = time.monotonic()
    land_a, land_b = landscape(op, shape, dtype, chip_a), landscape(op, shape, dtype, chip_b)
    spec = builtin_spec(op, shape, dtype)
    store = create_run(settings, spec, "sim", library_skeleton(op, "triton_ascend"), seed=seed,
                       command=f"bench/sim_retune.py {name}", extra={"backend_options": {"chip": chip_a}})
    summary = execute(store, settings, budget, make_evaluator=with_backend_options(None, {"chip": chip_a}))
    report = retune(store.path, settings, chip=chip_b, budget=budget, seed=seed,
                    command=f"bench/sim_retune.py {name}")
    best_a, best_b = min(land_a.values()), min(land_b.values())
    old_key = json.dumps(report["old"]["winner"], sort_keys=True, separators=(",", ":"))
    return {
        "case": name, "op": op, "shape": shape, "dtype": dtype, "chips": [chip_a, chip_b], "budget": budget,
        "tuned_on_a_s": summary["best"]["median_s"], "landscape_best_a_s": best_a,
        "old_on_b_s": report["old_winner_on_new"]["median_s"], "old_on_b_status": report["old_winner_on_new"]["status"],
        "new_on_b_s": report["new_winner"]["median_s"], "landscape_best_b_s": best_b,
        "landscape_old_on_b_s": land_b.get(old_key), "gap": report["gap"],
        "old_winner": report["old"]["winner"], "new_winner": report["new_winner"]["config"],
        "valid_configs": [len(land_a), len(land_b)], "wall_s": round(time.monotonic() - t0, 1),
        "runs": [str(store.path), report["run"]],
    }


def us(s):
    return f"{s * 1e6:.1f} µs" if s else "-"


def cfg(c):
    return " ".join(f"{k}={v}" for k, v in c.items())


def table(rows):
    out = ["| case | A → B | tuned on A (landscape best) | old winner on B | new winner on B (landscape best) | gap |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        gap = f"{r['gap']['percent']:+.1f} %" if r["gap"] else "-"
        out.append(f"| {r['op']} {r['shape']} {r['dtype']} | {r['chips'][0]} → {r['chips'][1]} | "
                   f"{us(r['tuned_on_a_s'])} ({us(r['landscape_best_a_s'])}) | "
                   f"{us(r['old_on_b_s']) if r['old_on_b_status'] == 'OK' else r['old_on_b_status']} | "
                   f"{us(r['new_on_b_s'])} ({us(r['landscape_best_b_s'])}) | {gap} |")
    out.append("")
    for r in rows:
        out.append(f"- {r['op']} {r['shape']}: old winner `{cfg(r['old_winner'])}`, new winner "
                   f"`{cfg(r['new_winner'])}`; {r['valid_configs'][0]} / {r['valid_configs'][1]} valid configs "
                   f"on {r['chips'][0]} / {r['chips'][1]}; {r['wall_s']} s")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="write the rows as JSON here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as runs:
        rows = []
        for name in args.cases.split(","):
            rows.append(run_case(name, args.budget, runs, args.seed))
            print(f"{name}: done in {rows[-1]['wall_s']} s", file=sys.stderr)
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
