"""A sweep warm-started (the default) against the same sweep all cold, on a real device.

Writes one sweep file per mode (the same ops, shapes, budget, sampler and seed; `warm_start:
false` for the cold one), runs `python -m tuner sweep` on each, and prints per task the best
time each found, the best-so-far after n evaluations as a ratio to the better of the two, and
the first evaluation within 3 % of it (with several --seeds, the medians too). In the warm sweep an op's first task runs cold as well
(it is what the others start from), so those rows differ only by chance.

    python bench/sweep_warm_start.py --backend cuda --dtype bf16 --budget 30 \\
        --seeds 0,1,2 --case layernorm:4096x4096,2048x16384,16384x2048 --case cross_entropy:4096x32000,8192x50257
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from warm_start import best_so_far  # noqa: E402

MARKS = (1, 3, 5, 10, 20, 30, 40, 60)


def sweep_text(cases: list[tuple[str, list[str]]], backend: str, dtype: str, budget: int, seed: int,
               warm: bool, patience: int | None = None) -> str:
    lines = [f"name: warm-{'on' if warm else 'off'}", f'backend: "{backend}"', f"dtypes: [{dtype}]",
             f"budget: {budget}", "sampler: guided", f"seed: {seed}", f"warm_start: {str(warm).lower()}",
             *([f"patience: {patience}"] if patience else []), "ops:"]
    lines += [f"  {op}: {{shapes: [{', '.join(shapes)}]}}" for op, shapes in cases]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, metavar="OP:SHAPE,SHAPE,...",
                    help="an op and its shapes, the first of which the others start from (repeatable)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[0],
                    help="comma-separated; each runs both sweeps")
    ap.add_argument("--patience", type=int, default=None,
                    help="the sweeps' `patience:` (a task stops after this many evaluations without a 0.5 %% gain)")
    ap.add_argument("--executor", choices=("local", "ray"), default="local",
                    help="tuner sweep's executor (ray: an op's later tasks wait for its first)")
    ap.add_argument("--out", default=None, help="where the two sweeps go (default: a temporary folder)")
    args = ap.parse_args(argv)
    cases = []
    for c in args.case:
        op, _, shapes = c.partition(":")
        if not op or not shapes:
            ap.error(f"--case {c!r}: expected OP:SHAPE,SHAPE,...")
        cases.append((op, shapes.split(",")))

    work = Path(args.out or tempfile.mkdtemp(prefix="sweep_warm_"))
    work.mkdir(parents=True, exist_ok=True)
    first_tasks = {f"{op}-{shapes[0]}-{args.dtype}-{args.backend}" for op, shapes in cases}
    marks = [n for n in MARKS if n <= args.budget]
    firsts: dict[tuple[str, str], list[int]] = {}  # (task, mode) -> first within 3 %, per seed
    finals: dict[tuple[str, str], list[float]] = {}  # (task, mode) -> best / the better best, per seed
    evals = {"cold": 0, "warm": 0}  # evaluations of all tasks, over every seed
    for seed in args.seeds:
        curves: dict[str, dict[str, list[float]]] = {}
        walls = {}
        for mode, warm in (("cold", False), ("warm", True)):
            f = work / f"{mode}-{seed}.yaml"
            f.write_text(sweep_text(cases, args.backend, args.dtype, args.budget, seed, warm, args.patience))
            cmd = [sys.executable, "-m", "tuner", "sweep", str(f), "--out", str(work / f"{mode}-{seed}"), "--quiet",
                   "--executor", args.executor]
            print("$", " ".join(cmd), flush=True)
            t0 = time.monotonic()
            with open(work / f"{mode}-{seed}.out", "w") as log:  # its own summary table: kept, not printed
                done = subprocess.run(cmd, cwd=ROOT, stdout=log)
            walls[mode] = time.monotonic() - t0
            if done.returncode != 0:
                raise SystemExit(f"{mode}: tuner sweep exited with {done.returncode}")
            curves[mode] = {p.name: best_so_far(p) for p in sorted((work / f"{mode}-{seed}" / "tasks").iterdir())}
            evals[mode] += sum(map(len, curves[mode].values()))

        print(f"\n{args.backend}, {args.dtype}, budget {args.budget} per task, guided, seed {seed}, "
              f"{args.executor} executor; "
              f"sweep wall time: cold {walls['cold']:.0f} s, warm {walls['warm']:.0f} s; evaluations: "
              f"cold {sum(map(len, curves['cold'].values()))}, warm {sum(map(len, curves['warm'].values()))}"
              + (f" (patience {args.patience})" if args.patience else ""))
        print("| task | mode | best (us) | " + " | ".join(f"after {n}" for n in marks) + " | first within 3 % |")
        print("| --- | --- | --- | " + " | ".join("---" for _ in marks) + " | --- |")
        for task in curves["cold"]:
            both = [c for m in curves for c in [curves[m].get(task, [])] if c]
            overall = min(min(c) for c in both)
            for mode in curves:
                c = curves[mode].get(task, [])
                if not c:
                    continue
                cells = [f"{c[n - 1] / overall:.3f}" if n <= len(c) and math.isfinite(c[n - 1]) else "–"
                         for n in marks]
                first = next((i + 1 for i, v in enumerate(c) if v <= overall * 1.03), None)
                firsts.setdefault((task, mode), []).append(first or args.budget + 1)
                finals.setdefault((task, mode), []).append(min(c) / overall)
                label = task + (" (first: cold in both)" if task in first_tasks else "")
                print(f"| {label} | {mode} | {min(c) * 1e6:.2f} | " + " | ".join(cells)
                      + f" | {first or 'not within budget'} |")

    if len(args.seeds) > 1:
        print(f"\nOver seeds {', '.join(map(str, args.seeds))}: median first evaluation within 3 % of the "
              f"better of the pair ({args.budget + 1}: not within budget) and median best / the better best")
        print(f"(evaluations of all tasks over the seeds: cold {evals['cold']}, warm {evals['warm']})")
        print("| task | cold: first within 3 % | warm | cold: best ratio | warm |")
        print("| --- | --- | --- | --- | --- |")
        for task in sorted({t for t, _ in firsts}, key=lambda t: (t in first_tasks, t)):
            label = task + (" (first: cold in both)" if task in first_tasks else "")
            cells = [statistics.median(firsts.get((task, m), [math.nan])) for m in ("cold", "warm")]
            ratios = [statistics.median(finals.get((task, m), [math.nan])) for m in ("cold", "warm")]
            print(f"| {label} | {cells[0]:g} | {cells[1]:g} | {ratios[0]:.3f} | {ratios[1]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
