"""Do a kernel's timings depend on what runs around it? The same configs of one library op,
timed on one GPU in the ways this project times them, with the GPU's clocks and power traced.

1. `search`: a tuning run that evaluates exactly the given configs (the harness: bench
   worker, buffer rotation, poison, L2 flush, its final re-timing), medians from its records.
2. `interleave`: the winners' loaded kernels timed in rotation, ten calls each per round (as
   bench/gpu_bench.py times contenders), first among themselves, then with torch.compile and a
   copy of the op's bytes as neighbours.
3. `sustained`: each kernel alone, back to back for --sustain-s, one CUDA event pair per call
   (no flush): how the time per call moves as the GPU stays loaded.
4. `search again`: a second tuning run, the configs in reverse order.

A background `nvidia-smi` samples the SM clock, power and the clock-event reasons every 50 ms;
each phase's start and end are logged, so the trace can be cut per phase.

    python bench/timing_context.py --case attention_causal:4x32x4096x128 --configs cfgs.json [--out DIR]

cfgs.json: a list of configs (param -> value), each a point of the op's Triton skeleton;
bench/configs/attention_causal_island.json holds the six around attention_causal's optimum at
4x32x4096x128 (64/64 with and without TMA descriptors, 128/128, 128/64).
Writes <out>/timing_context.json, <out>/smi.csv and prints a table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_bench import compiled_fn, copy_fn, interleaved, op_buffers, settings_for  # noqa: E402

from tuner.core.ops import builtin_spec, load_op  # noqa: E402
from tuner.core.skeleton import library_skeleton  # noqa: E402
from tuner.core.values import Config, Status  # noqa: E402
from tuner.run.tune import create_run, execute  # noqa: E402

SMI_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def name_of(cfg: dict) -> str:
    return "/".join(f"{k}={v}" for k, v in sorted(cfg.items()))


def search(op_name: str, shape: str, configs: list[dict], out: Path, seed: int) -> dict:
    """Medians (s) per config as a tuning run measured them, and the artifacts to load."""
    settings = settings_for(out)
    spec = builtin_spec(op_name, shape, "bf16")
    store = create_run(settings, spec, "cuda", library_skeleton(op_name, "triton"), seed=seed,
                       command=f"bench/timing_context.py {op_name} {shape}")
    summary = execute(store, settings, len(configs) + 1, seeds=tuple(Config.of(c) for c in configs))
    got = {}
    for r in store.records():
        key = name_of(r.config.to_json())
        if r.status is Status.OK and r.measurement.detail.startswith("re-timed") and key in got:
            got[key]["retimed_us"] = round(r.seconds * 1e6, 2)  # the final re-timing, interleaved
        elif r.status is Status.OK:
            got[key] = {"median_us": round(statistics.median(r.measurement.samples) * 1e6, 2),
                        "n": len(r.measurement.samples), "artifact": r.build.artifact,
                        "anchored_us": round(r.anchored_s * 1e6, 2) if r.anchored_s else None}
        else:
            got[key] = {"status": r.status.value, "detail": r.reason[:200]}
    return {"configs": got, "best": summary.get("best"), "final": summary.get("final"), "run": str(store.path)}


def sustained(backend, fn, seconds: float) -> dict:
    """Back-to-back calls for `seconds`, one event pair each: median time per call in the first
    50 ms, in the middle and in the last quarter of the run."""
    import torch
    pairs = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            batch.append((a, b))
        torch.cuda.synchronize()
        pairs.extend(a.elapsed_time(b) * 1e3 for a, b in batch)
    n = len(pairs)
    cum, first = 0.0, []
    for p in pairs:
        if cum > 50e3:
            break
        first.append(p)
        cum += p
    return {"calls": n, "first_50ms_us": round(statistics.median(first), 2),
            "middle_us": round(statistics.median(pairs[n // 3: 2 * n // 3]), 2),
            "last_quarter_us": round(statistics.median(pairs[3 * n // 4:]), 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", required=True, help="op:shape, e.g. attention_causal:4x32x4096x128")
    p.add_argument("--configs", required=True, help="JSON file: a list of configs")
    p.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    p.add_argument("--sustain-s", type=float, default=1.5)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    op_name, shape = args.case.split(":", 1)
    configs = json.loads(Path(args.configs).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,nounits", "-lms", "50"],
                           stdout=open(out / "smi.csv", "w"), stderr=subprocess.DEVNULL)
    phases, result = [], {"case": args.case}

    def phase(name, f):
        t0 = time.time()
        print(f"-- {name}", flush=True)
        v = f()
        phases.append({"phase": name, "start": t0, "end": time.time()})
        result[name] = v
        (out / "timing_context.json").write_text(json.dumps({**result, "phases": phases}, indent=1, default=str))
        print(json.dumps(v, default=str)[:3000], flush=True)
        return v

    try:
        first = phase("search", lambda: search(op_name, shape, configs, out / "s1", seed=0))
        from tuner.backends.cuda import CudaBackend
        spec = builtin_spec(op_name, shape, "bf16")
        op = load_op(spec)
        backend = CudaBackend(0, cache_dir=str(out / "cache"))
        xs, outs = op_buffers(op, backend)
        fns = {}
        for key, v in first["configs"].items():
            if "artifact" in v:
                k = backend.load(v["artifact"], op)
                fns[key] = (lambda k: lambda: k(*xs, *outs))(k)
        us = lambda t: {k: round(v * 1e6, 2) for k, v in t.items()}  # noqa: E731
        phase("interleave", lambda: us(interleaved(backend, fns, rounds=args.rounds)))
        peers = dict(fns, copy=copy_fn(op), compile=compiled_fn(op, xs))
        phase("interleave with peers", lambda: us(interleaved(backend, peers, rounds=args.rounds)))
        phase("sustained", lambda: {k: sustained(backend, f, args.sustain_s) for k, f in fns.items()})
        phase("search again", lambda: search(op_name, shape, configs[::-1], out / "s2", seed=1))
    finally:
        smi.terminate()
    print("\n| config | search | interleave | with peers | sustained first 50 ms / last quarter | search again |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, v in result["search"]["configs"].items():
        s2 = result.get("search again", {}).get("configs", {}).get(key, {})
        st = result.get("sustained", {}).get(key, {})
        print(f"| {key} | {v.get('median_us', v.get('status'))} | {result.get('interleave', {}).get(key)} | "
              f"{result.get('interleave with peers', {}).get(key)} | {st.get('first_50ms_us')} / "
              f"{st.get('last_quarter_us')} | {s2.get('median_us', s2.get('status'))} |")


if __name__ == "__main__":
    main()
