"""Where one candidate's measurement spends its time on a GPU, and what slows it down.

Compiles N configs of the 202-config matmul list (bench/triton_matmul202.yaml, 4096^3 bf16)
in a process pool, then measures each in this process the way a benchmark Worker does
(tuner.exec.measure.measure: load, verify on two input sets, timed repetitions), under cProfile.
Prints milliseconds per candidate for each phase and the functions that took the time.

    python bench/measure_profile.py [--configs 24] [--hog N] [--out DIR]

--hog N runs N busy processes at niceness +10 meanwhile (what N compile workers do to the
host). Run two at once with CUDA_VISIBLE_DEVICES=0 and =1 to see whether two GPUs slow each
other's measurements.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_bench import matmul202  # noqa: E402

from tuner.core.settings import Settings  # noqa: E402
from tuner.core.values import OpSpec  # noqa: E402


def _compile(job):
    from tuner.backends.cuda import CudaBackend
    source, workdir, cache_dir, op_json = job
    return CudaBackend(0, cache_dir=cache_dir, op=op_json).compile(source, OpSpec.from_json(op_json), workdir, 300)


def _hog():
    os.nice(10)
    while True:
        pass


def main() -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--configs", type=int, default=24)
    a.add_argument("--hog", type=int, default=0, help="busy processes at niceness +10 meanwhile")
    a.add_argument("--bench-budget", type=float, default=0.05)
    a.add_argument("--out", default=None)
    args = a.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="measure_profile_"))
    out.mkdir(parents=True, exist_ok=True)
    spec, skeleton, ctx, configs = matmul202()
    step = max(1, len(configs) // args.configs)
    chosen = configs[::step][:args.configs]
    jobs = [(skeleton.render(c, ctx), str(out / "build" / f"c{i}"), str(out / "cache"), spec.to_json())
            for i, c in enumerate(chosen)]
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(min(16, os.cpu_count() or 1)) as pool:
        builds = pool.map(_compile, jobs)
    compile_s = time.monotonic() - t0
    artifacts = [b.artifact for b in builds if b.artifact]
    if len(artifacts) < 2:
        raise SystemExit(f"{len(builds) - len(artifacts)} of {len(builds)} compiles failed; first: "
                         f"{next((b.error for b in builds if not b.artifact), '')}")

    from tuner.backends.cuda import CudaBackend
    from tuner.exec import measure
    backend = CudaBackend(0, cache_dir=str(out / "cache"))
    settings = Settings.from_env(runs_dir=str(out / "runs"), cache_dir=str(out / "cache"),
                                 bench_budget_s=args.bench_budget)
    hogs = [mp.get_context("spawn").Process(target=_hog, daemon=True) for _ in range(args.hog)]
    for h in hogs:
        h.start()
    try:
        t_first = time.perf_counter()
        measure.measure(backend, artifacts[0], spec, settings)  # once per process: sets, launcher
        first_s = time.perf_counter() - t_first
        per: dict[str, list[float]] = {"load_s": [], "check_s": [], "bench_s": [], "total_s": []}
        prof = cProfile.Profile()
        for art in artifacts[1:]:
            before = dict(measure.TIMES)
            t = time.perf_counter()
            prof.enable()
            measure.measure(backend, art, spec, settings)
            prof.disable()
            per["total_s"].append(time.perf_counter() - t)
            for k in ("load_s", "check_s", "bench_s"):
                per[k].append(measure.TIMES[k] - before[k])
        cpu = os.times()
    finally:
        for h in hogs:
            h.kill()
    result = {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "hog": args.hog,
              "candidates": len(artifacts) - 1, "compile_s": round(compile_s, 1),
              "first_measure_ms": round(first_s * 1e3, 1),
              "ms_per_candidate": {k: round(statistics.median(v) * 1e3, 2) for k, v in per.items()},
              "ms_per_candidate_mean": {k: round(statistics.mean(v) * 1e3, 2) for k, v in per.items()},
              "process_cpu_s": round(cpu.user + cpu.system, 1)}
    print(json.dumps(result), flush=True)
    s = io.StringIO()
    stats = pstats.Stats(prof, stream=s)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    print(s.getvalue())
    (out / "measure_profile.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
