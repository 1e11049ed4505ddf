"""The engine's own cost per evaluation, on the null backend (no compiler, scripted times).

Everything but the kernel is real: Optuna ask/tell (the study in memory, as in a run), the
constraint filter, rendering, the compile and benchmark worker processes, verification
against the reference, records fsynced to disk.

    python bench/engine_overhead.py [--budget 200] [--sampler tpe]

numpy's BLAS runs single-threaded unless OPENBLAS_NUM_THREADS (MKL_NUM_THREADS) says otherwise.
"""

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

# The guided sampler's GP works on small matrices (a few hundred rows): BLAS threads only
# contend with the compile and benchmark workers, and on a loaded 2-core machine they made its
# ask up to 5x slower (spinning threads). Set before numpy loads; the environment overrides.
for _v in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # numpy's BLAS, not torch's OpenMP
    os.environ.setdefault(_v, "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.core.ops import builtin_spec  # noqa: E402
from tuner.core.settings import Settings  # noqa: E402
from tuner.core.skeleton import load_skeleton  # noqa: E402
from tuner.exec.evaluate import Evaluator  # noqa: E402
from tuner.run.tune import create_run, run_search  # noqa: E402
from tuner.search.searcher import Searcher  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--sampler", default="guided")
    args = ap.parse_args()
    # A wide space (8^5 points, a smooth bowl) so that the budget, not the space, ends the search.
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "wide.txt.j2").write_text(
            "time: {{ 1e-4 * (1 + (A - 3) ** 2 + (B - 4) ** 2 + (C - 2) ** 2 + (D - 5) ** 2 + (E - 1) ** 2) }}\n")
        (Path(tmp) / "wide.yaml").write_text(
            "language: script\nparams:\n" + "".join(f"  {p}: {{range: [0, 7]}}\n" for p in "ABCDE"))
        skeleton = load_skeleton(Path(tmp) / "wide.txt.j2", Path(tmp) / "wide.yaml")
        settings = Settings(runs_dir=tmp, cache_dir=tmp, bench_budget_s=0.002, min_reps=3, max_reps=10)
        spec = builtin_spec("softmax", "64x256")
        store = create_run(settings, spec, "null", skeleton, args.sampler, seed=0)
        ev = Evaluator("null", spec, skeleton, settings, store.path)
        try:
            ev.start()
            searcher = Searcher(skeleton.space, args.sampler, 0)
            t0 = time.perf_counter()
            p = run_search(store, ev, searcher, args.budget, None, settings.n_compile_workers)
            dt = time.perf_counter() - t0
        finally:
            ev.close()
    asks = p.evaluations + p.invalid + p.repeats
    print(f"| machine | sampler | evaluated | invalid (filtered) | repeats | seconds | evaluations/s | asks/s |")
    print(f"| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {platform.machine()} {settings.n_compile_workers} cores | {args.sampler} | {p.evaluations} | "
          f"{p.invalid} | {p.repeats} | {dt:.1f} | {p.evaluations / dt:.1f} | {asks / dt:.1f} |")


if __name__ == "__main__":
    main()
