"""Warm starts on a real device: the same tune cold, from the sources' best configs only, and
with the sources' timings as the guided searcher's prior, side by side.

Runs `python -m tuner tune` three times with the same op, shape, budget and seed:

* cold: no warm start;
* best only: `--warm-start` a JSON list of each source's best config (a list has no timings,
  so no prior: what `--warm-start` did before the prior existed);
* prior: `--warm-start` each source (their best first, all their timings as the prior).

and prints, for each, the best-so-far time after n evaluations as a ratio to the best any of
the three found, and the first evaluation within 3 % of it. One seed per mode: a device run,
not a replay (bench/search_efficiency.py has the replayed medians over 20 seeds).

    python bench/warm_start.py layernorm --shape 2048x16384 --dtype bf16 --backend cuda \\
        --source bench/landscapes/layernorm-4096x4096-bf16-h200 \\
        --source bench/landscapes/layernorm-8192x8192-bf16-h200 --budget 30
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.core import landscape as landscapes  # noqa: E402
from tuner.core.values import Status  # noqa: E402
from tuner.run.store import Store  # noqa: E402

MARKS = (1, 3, 5, 10, 15, 20, 30, 40, 60)


def best_so_far(run: Path) -> list[float]:
    """Best time after each evaluation (INVALID configs, never compiled, do not count)."""
    out, best = [], math.inf
    for r in Store.open(run).records():
        if r.status is Status.INVALID:
            continue
        if r.status is Status.OK and r.seconds < best:
            best = r.seconds
        out.append(best)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--source", action="append", required=True,
                    help="a run directory or landscape of the same op and skeleton (repeatable)")
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs-dir", default=None, help="where the three runs go (default: a temporary folder)")
    args = ap.parse_args(argv)

    work = Path(args.runs_dir or tempfile.mkdtemp(prefix="warm_start_"))
    work.mkdir(parents=True, exist_ok=True)
    bests = []
    for src in args.source:
        configs = landscapes.load(src).ranked(1)
        if not configs:
            raise SystemExit(f"{src}: no config passed there; nothing to warm-start from")
        bests.append(configs[0].as_dict())
    best_list = work / "sources_best.json"
    best_list.write_text(json.dumps(bests))
    modes = {"cold": ["--fresh"], "best only": ["--warm-start", str(best_list)],
             "prior": [a for s in args.source for a in ("--warm-start", s)]}
    curves: dict[str, list[float]] = {}
    for name, extra in modes.items():
        runs = work / name.replace(" ", "_")
        cmd = [sys.executable, "-m", "tuner", "tune", args.op, "--shape", args.shape, "--dtype", args.dtype,
               "--backend", args.backend, "--budget", str(args.budget), "--seed", str(args.seed),
               "--runs-dir", str(runs), "--quiet", *extra]
        print("$", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{name}: tuner tune exited with {done.returncode}")
        (run,) = [p for p in runs.iterdir() if p.is_dir()]
        curves[name] = best_so_far(run)
    overall = min(min(c) for c in curves.values() if c)
    marks = [n for n in MARKS if n <= args.budget]
    print(f"\n{args.op} {args.shape} {args.dtype} on {args.backend}, budget {args.budget}, seed {args.seed}; "
          f"best found by any mode {overall * 1e6:.2f} us")
    print("| mode | best (us) | " + " | ".join(f"after {n}" for n in marks) + " | first within 3 % |")
    print("| --- | --- | " + " | ".join("---" for _ in marks) + " | --- |")
    for name, c in curves.items():
        cells = [f"{c[n - 1] / overall:.3f}" if n <= len(c) and math.isfinite(c[n - 1]) else "–" for n in marks]
        first = next((i + 1 for i, v in enumerate(c) if v <= overall * 1.03), None)
        print(f"| {name} | {min(c) * 1e6:.2f} | " + " | ".join(cells) + f" | {first or 'not within budget'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
