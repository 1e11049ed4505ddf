"""The kernel library on one NVIDIA GPU, in one run.

`ops`: for each op at two shapes (bf16), a tuning run of the library's Triton skeleton and of
its CUDA C++ one where it has one (`--languages`), then, in this process and timed the same
way (CUDA events, L2 flushed before each call, median of many, contenders interleaved): the
tuned kernels, Liger Kernel's Triton kernel where it has the op (if installed), torch eager, torch.compile(mode=
"max-autotune-no-cudagraphs") (each timed as the tuner times: repetitions queued, each
with its own flush and events, waited for once), against the ceiling the run measured (copy bandwidth for
memory-bound ops, and a copy of the op's own byte count timed in the same interleave; the
cuBLAS bf16 rate for matmul and attention).

`seeds`: the default search once per seed (--seeds, default 5) per case, on the Triton skeleton
or the CUDA C++ one (--language cuda); every seed's winner, torch eager, torch.compile, Liger
and a copy of the op's bytes timed in one interleave: the spread a user sees running the same
command twice. Each seed's records are copied to <out>/records/.

`autotune`: tuning wall time on the 202-config matmul space of bench/triton_matmul202.yaml at
4096^3 bf16: the tuner (every config, grid; and TPE with a budget) against @triton.autotune
over the same config list (serial compile, then do_bench per config), each with a cold cache.

    python bench/gpu_bench.py ops [--ops softmax,matmul] [--cases matmul:16x14336x4096] [--budget 40] [--out DIR]
    python bench/gpu_bench.py seeds [--cases softmax:8192x8192] [--seeds 5] [--budget 40] [--language cuda]
    python bench/gpu_bench.py autotune [--part autotune|grid|tpe|winners] [--compile-workers N] [--out DIR]

Writes <out>/gpu_<what>.json (rows appended as they finish) and prints a markdown table.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.core.ops import builtin_spec, load_op  # noqa: E402
from tuner.core.settings import Settings  # noqa: E402
from tuner.core.skeleton import library_skeleton, load_skeleton  # noqa: E402
from tuner.core.values import Status  # noqa: E402
from tuner.exec.measure import round_order  # noqa: E402
from tuner.run.tune import create_run, execute, with_backend_options  # noqa: E402

CASES = [
    ("softmax", "8192x8192"), ("softmax", "32768x4096"),
    ("rmsnorm", "8192x8192"), ("rmsnorm", "32768x4096"),
    ("layernorm", "8192x8192"), ("layernorm", "32768x4096"),
    ("add_rmsnorm", "16384x4096"), ("add_rmsnorm", "4096x8192"),
    ("swiglu", "8192x14336"), ("swiglu", "4096x28672"),
    ("rope", "4096x32x128"), ("rope", "16384x8x128"),
    ("cross_entropy", "4096x32000"), ("cross_entropy", "2048x128256"),
    ("matmul", "4096x4096x4096"), ("matmul", "16x14336x4096"),
    ("attention", "4x32x4096x128"), ("attention_causal", "4x32x4096x128"),
    ("attention_decode", "16x32x8x4097x128"), ("attention_decode", "16x32x8x1025x128"),
]
COMPUTE_BOUND = {"matmul:4096x4096x4096", "attention:4x32x4096x128", "attention_causal:4x32x4096x128"}


COMPILE_WORKERS = max(1, (os.cpu_count() or 2) - 1)  # --compile-workers


def settings_for(out: Path, **kw) -> Settings:
    return Settings.from_env(runs_dir=str(out / "runs"), cache_dir=str(out / "cache"),
                             compile_workers=COMPILE_WORKERS, bench_budget_s=0.05, **kw)


def interleaved(backend, fns: dict, rounds: int = 10, per_round: int = 10) -> dict:
    samples = {k: [] for k in fns}
    for f in fns.values():  # warm-up: first-touch, lazy init
        for _ in range(3):
            f()
    backend.sync()
    names = list(fns)
    for r in range(rounds):
        # Each round starts one contender later: a place in the round that is faster or slower
        # (the clocks after a memory-bound neighbour, a compute-bound kernel's heating; five
        # copies of one attention kernel read 2298-2408 us in fixed order) falls on each alike.
        for k in (names[i] for i in round_order(len(names), r)):
            f = fns[k]
            # queued and waited for once, as the tuner times: with a wait after each call, a
            # launcher that spends longer on the host than the L2 flush takes on the GPU
            # (building TMA descriptors) was charged for that host time
            samples[k].extend(backend.time_calls(f, per_round))
    return {k: statistics.median(v) for k, v in samples.items()}


def kernel_names(fn) -> list[str]:
    """The GPU kernels one call of fn runs (which library kernel torch picked)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key[:120] for e in prof.key_averages() if e.device_type.name == "CUDA"})


def liger_fn(op_name: str, xs: list):
    """Liger Kernel's Triton kernel for the op on the same inputs (forward), or None where it
    has none that takes them as they are (rope: Liger's wants q and k as [B, H, S, D] and
    rotates both in place)."""
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        return None
    if op_name == "softmax":
        return lambda: lf.liger_softmax(xs[0])
    if op_name == "rmsnorm":
        return lambda: lf.liger_rms_norm(xs[0], xs[1], 1e-6, in_place=False)
    if op_name == "layernorm":
        return lambda: lf.liger_layer_norm(xs[0], xs[1], xs[2], 1e-5)
    if op_name == "swiglu":
        return lambda: lf.liger_swiglu(xs[0], xs[1])
    if op_name == "cross_entropy":
        return lambda: lf.liger_cross_entropy(xs[0], xs[1], reduction="none")
    return None


def op_buffers(op, backend) -> tuple[list, list]:
    """The op's inputs (seed 12345) on the GPU and empty outputs of its shapes."""
    import torch
    host = op.make_inputs(12345)
    xs = [backend.to_device(x) for x in host]
    outs = [torch.empty(o.shape, dtype=xs[0].dtype, device="cuda") for o in
            op.reference([x.to("meta", torch.float64) if x.is_floating_point() else x.to("meta") for x in host])]
    return xs, outs


def copy_fn(op):
    """A device-to-device copy moving as many bytes as the op (half read, half written), timed
    in the same interleave: the ceiling at this size, where launch and ramp weigh on a short
    kernel that a 1 GiB copy does not show."""
    import torch
    src = torch.empty(int(op.bytes // 2), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def compiled_fn(op, xs):
    """torch.compile (max-autotune-no-cudagraphs) of the op's torch code, compiled here."""
    import torch
    # A fresh Dynamo per op, shapes static: every op's lambda is one code object to Dynamo,
    # so without the reset the second shape of an op got a dynamic-shape kernel and, past
    # Dynamo's recompile limit, later ops in the process ran eagerly, silently.
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: op.torch_impl(list(a)), mode="max-autotune-no-cudagraphs", dynamic=False)
    fn(*xs)
    torch.cuda.synchronize()
    return lambda: fn(*xs)


def tune_one(op_name: str, shape: str, language: str, budget: int, out: Path, row: dict, seed: int = 0):
    """A tuning run of the library's `language` skeleton; the winner's launch function loaded
    here, or None (the reason in row)."""
    from tuner.backends.cuda import CudaBackend
    settings = settings_for(out)
    spec = builtin_spec(op_name, shape, "bf16")
    store = create_run(settings, spec, "cuda", library_skeleton(op_name, language), seed=seed,
                       command=f"bench/gpu_bench.py ops {op_name} {shape} ({language})",
                       extra={"backend_options": {"language": language}} if language != "triton" else None)
    t0 = time.monotonic()
    summary = execute(store, settings, budget,
                      make_evaluator=with_backend_options(None, {"language": language}) if language != "triton" else None)
    tag = "" if language == "triton" else f"{language}_"
    row.update({f"{tag}tune_wall_s": round(time.monotonic() - t0, 1), f"{tag}trials": summary["evaluations"],
                f"{tag}failures": {k: f"{v['count']}: {v['example'][:160]}" for k, v in summary["failures"].items()
                                   if k != "INVALID"},
                "device": summary["device"]["name"], "peaks": summary["device"]["peaks"],
                f"{tag}anchored": summary.get("anchored"), f"{tag}drift": summary.get("drift")})
    best = summary["best"]
    if best is None:
        row[f"{tag}error"] = "no config passed: " + json.dumps(summary["failures"])[:500]
        return None
    winner = next(r for r in store.records() if r.status is Status.OK and r.config.to_json() == best["config"])
    row[f"{tag}config"] = best["config"]
    row[f"{tag}run_best_us"] = round(best["median_s"] * 1e6, 2)  # as its own run timed it
    backend = CudaBackend(0, cache_dir=settings.cache_dir, language=language)
    return backend.load(winner.build.artifact, load_op(spec))


def bench_op(op_name: str, shape: str, budget: int, out: Path, with_compile: bool = True,
             languages: tuple[str, ...] = ("triton",)) -> dict:
    import torch

    from tuner.backends.cuda import CudaBackend
    from tuner.core.skeleton import library_skeletons
    settings = settings_for(out)
    spec = builtin_spec(op_name, shape, "bf16")
    row = {"op": op_name, "shape": shape}
    kernels = {}
    for lang in languages:
        if lang in library_skeletons().get(op_name, []):
            try:
                k = tune_one(op_name, shape, lang, budget, out, row)
            except Exception as e:  # noqa: BLE001 - e.g. a space with no config at this shape
                row[f"{lang}_error"] = f"{type(e).__name__}: {e}"[:300]
                continue
            if k is not None:
                kernels[lang] = k
    if not kernels:
        row.setdefault("error", "no skeleton named a winner")
        return row
    row["tune_wall_s"], row["trials"] = row.get("tune_wall_s"), row.get("trials")
    op = load_op(spec)
    backend = CudaBackend(0, cache_dir=settings.cache_dir)
    xs, outs = op_buffers(op, backend)
    # Each language's winner: "tuned" (Triton), "tuned_<language>" for the others.
    names = {lang: "tuned" if lang == "triton" else f"tuned_{lang}" for lang in kernels}
    fns = {"eager": lambda: op.torch_impl(xs)}
    for lang, k in kernels.items():
        fns[names[lang]] = (lambda k: lambda: k(*xs, *outs))(k)
    liger = liger_fn(op_name, xs)
    if liger is not None:
        fns["liger"] = liger
    key = f"{op_name}:{shape}"
    if key not in COMPUTE_BOUND:
        fns["copy"] = copy_fn(op)
    if with_compile:
        t1 = time.monotonic()
        fns["compile"] = compiled_fn(op, xs)
        row["compile_s"] = round(time.monotonic() - t1, 1)
    for lang, k in kernels.items():
        k(*xs, *outs)
        ref = op.torch_impl(xs)
        tag = "" if lang == "triton" else f"{lang}_"
        row[f"{tag}max_diff_vs_eager"] = max(float((o.float() - r.float()).abs().max())
                                             for o, r in zip(outs, [ref] if torch.is_tensor(ref) else ref))
    t = interleaved(backend, fns)
    try:
        row["kernels"] = {k: kernel_names(fns[k]) for k in ("eager", "compile", "liger") if k in fns}
    except Exception as e:  # noqa: BLE001 - naming kernels is a note, never a lost row
        row["kernels"] = f"profiler: {type(e).__name__}: {e}"[:200]
    row.update({f"{k}_ms": round(v * 1e3, 4) for k, v in t.items()})
    ours = min(v for k, v in t.items() if k.startswith("tuned"))  # the faster language's winner
    if key in COMPUTE_BOUND:
        tf = {k: op.flops / v / 1e12 for k, v in t.items()}
        row.update({f"{k}_tflops": round(v, 1) for k, v in tf.items()})
        row["ceiling"] = {"what": "cuBLAS bf16 8192^3", "tflops": row["peaks"]["bf16_gflops"] / 1e3}
        row["pct_ceiling"] = round(100 * op.flops / ours / 1e12 / row["ceiling"]["tflops"], 1)
    else:
        bw = {k: op.bytes / v / 1e12 for k, v in t.items()}
        row.update({f"{k}_tbps": round(v, 3) for k, v in bw.items()})
        row["ceiling"] = {"what": "device copy", "tbps": row["peaks"]["copy_gbps"] / 1e3}
        row["pct_ceiling"] = round(100 * op.bytes / ours / 1e12 / row["ceiling"]["tbps"], 1)
        for k in t:
            if k.startswith("tuned") or k == "liger":
                row[f"{k}_pct_copy"] = round(100 * t["copy"] / t[k], 1)
        row["pct_same_size_copy"] = round(100 * t["copy"] / ours, 1)
    row["vs_eager"] = round(t["eager"] / ours, 3)
    if with_compile:
        row["vs_compile"] = round(t["compile"] / ours, 3)
    # Ours (the faster language) against the best a user would pick instead.
    peers = {k: v for k, v in t.items() if k in ("compile", "liger", "eager")}
    best_peer = min(peers, key=peers.get)
    row["best_ours_ms"], row["best_peer"] = round(ours * 1e3, 4), best_peer
    row["vs_best_peer"] = round(peers[best_peer] / ours, 3)
    return row


def cmd_ops(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.ops.split(",")) if args.ops else None
    cases = [tuple(c.split(":", 1)) for c in args.cases.split(",")] if args.cases else CASES
    rows, seen = [], set()
    for op_name, shape in cases:
        if (wanted and op_name not in wanted) or (args.first and op_name in seen):
            continue
        seen.add(op_name)
        budget = args.budget * (2 if op_name in ("matmul", "attention", "attention_causal") else 1)
        try:
            row = bench_op(op_name, shape, budget, out, not args.no_compile, tuple(args.languages.split(",")))
        except Exception as e:  # one op's failure must not lose the others' rows
            row = {"op": op_name, "shape": shape, "error": f"{type(e).__name__}: {e}"[:800]}
        rows.append(row)
        (out / "gpu_ops.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps(row), flush=True)
    print_ops_table(rows)


def print_ops_table(rows: list) -> None:
    print("\n| op | shape | Triton (ours) | CUDA C++ (ours) | Liger | torch.compile | eager | ours vs best peer | "
          "% same-size copy (best ours) | trials |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def ms(r, k):
        return f"{r[k + '_ms']:.4f} ms" if k + "_ms" in r else "-"
    for r in rows:
        if not any(k.startswith("tuned") and k.endswith("_ms") for k in r):
            print(f"| {r['op']} | {r['shape']} | error: {str(r.get('error', ''))[:120]} |")
            continue
        pct = max((v for k, v in r.items() if k.startswith("tuned") and k.endswith("_pct_copy")), default=None)
        print(f"| {r['op']} | {r['shape']} | {ms(r, 'tuned')} | {ms(r, 'tuned_cuda')} | {ms(r, 'liger')} | "
              f"{ms(r, 'compile')} | {ms(r, 'eager')} | {r['vs_best_peer']:.2f}x ({r['best_peer']}) | "
              f"{pct if pct is not None else '-'} | {r.get('trials')}/{r.get('cuda_trials', '-')} |")


# ---- the same command with five seeds --------------------------------------------------

def cmd_seeds(args) -> None:
    """Per case: the default search (guided, --budget trials, the --language skeleton: Triton
    by default) once per seed, then every seed's winner, torch eager, torch.compile, Liger and
    a copy of the op's bytes timed in one interleave.
    The spread is what a user sees running the same command twice; "worst vs best" compares
    the worst seed's winner with the best any seed found, in the same interleave."""
    from tuner.backends.cuda import CudaBackend
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in args.cases.split(","):
        op_name, shape = case.split(":", 1)
        row = {"op": op_name, "shape": shape, "budget": args.budget, "seeds": {}}
        kernels = {}
        for seed in range(args.seeds):
            info: dict = {}
            try:
                k = tune_one(op_name, shape, args.language, args.budget, out / f"{op_name}_{shape}_{seed}", info, seed)
            except Exception as e:  # noqa: BLE001 - one seed's failure is a row, not a lost run
                info["error"] = f"{type(e).__name__}: {e}"[:300]
                k = None
            row["seeds"][seed] = {k2: info[k2] for k2 in ("config", "run_best_us", "tune_wall_s", "trials", "anchored", "drift", "error")
                                  if k2 in info}
            # As each seed ends (a device call cut off by its time limit keeps what it finished).
            print(json.dumps({"op": op_name, "shape": shape, "seed": seed, **row["seeds"][seed]}), flush=True)
            # Each seed's records beside the table (small): what each search timed, in order.
            for rec in (out / f"{op_name}_{shape}_{seed}").rglob("records.jsonl"):
                (out / "records").mkdir(exist_ok=True)
                shutil.copyfile(rec, out / "records" / f"{op_name}_{shape}_{seed}.jsonl")
            if k is not None:
                kernels[f"seed {seed}"] = k
        # Seeds that named the same config share one kernel and one time: timed apart, copies of
        # one kernel differ by where they sit in the interleave, not by what the search found.
        same = {}
        for name in list(kernels):
            key = json.dumps(row["seeds"][int(name.split()[1])].get("config"), sort_keys=True)
            if key in same:
                kernels.pop(name)
                row["seeds"][int(name.split()[1])]["same_config_as"] = same[key]
            else:
                same[key] = name
        spec = builtin_spec(op_name, shape, "bf16")
        op = load_op(spec)
        backend = CudaBackend(0, cache_dir=str(out / "cache"))
        xs, outs = op_buffers(op, backend)
        fns = {name: (lambda k: lambda: k(*xs, *outs))(k) for name, k in kernels.items()}
        liger = liger_fn(op_name, xs)
        if liger is not None:
            fns["liger"] = liger
        fns["copy"] = copy_fn(op)
        fns["eager"] = lambda: op.torch_impl(xs)
        fns["compile"] = compiled_fn(op, xs)
        t = interleaved(backend, fns, rounds=args.rounds)
        for seed, info in row["seeds"].items():
            if "same_config_as" in info:
                t[f"seed {seed}"] = t[info["same_config_as"]]
        t = dict(sorted(t.items(), key=lambda kv: (not kv[0].startswith("seed"), kv[0])))
        row["us"] = {k: round(v * 1e6, 2) for k, v in t.items()}
        ours = [t[k] for k in t if k.startswith("seed")]
        if ours:
            peers = [t[k] for k in ("eager", "compile", "liger") if k in t]
            row["best_seed_us"], row["worst_seed_us"] = round(min(ours) * 1e6, 2), round(max(ours) * 1e6, 2)
            row["worst_vs_best_pct"] = round(100 * (max(ours) / min(ours) - 1), 2)
            row["worst_vs_best_peer_pct"] = round(100 * (max(ours) / min(peers) - 1), 2)
        if args.top:
            row["top"] = top_configs(out, op, op_name, shape, args.top, backend, xs, outs, args.rounds)
        rows.append(row)
        (out / "gpu_seeds.json").write_text(json.dumps(rows, indent=1))
        print(json.dumps(row), flush=True)
    print("\n| op | shape | seeds' winners (us) | worst vs best seed | best peer (us) | worst vs best peer | copy (us) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "worst_seed_us" not in r:
            print(f"| {r['op']} | {r['shape']} | no winner: {json.dumps(r['seeds'])[:200]} |")
            continue
        seeds = ", ".join(f"{v:.1f}" for k, v in r["us"].items() if k.startswith("seed"))
        peer = min((k for k in ("eager", "compile", "liger") if k in r["us"]), key=r["us"].get)
        print(f"| {r['op']} | {r['shape']} | {seeds} | +{r['worst_vs_best_pct']:.1f} % | {r['us'][peer]:.1f} ({peer}) | "
              f"{r['worst_vs_best_peer_pct']:+.1f} % | {r['us']['copy']:.1f} |")


def top_configs(out: Path, op, op_name: str, shape: str, n: int, backend, xs, outs, rounds: int) -> list[dict]:
    """Every seed's `n` fastest configs by the figure its search ranked them by, timed together
    in two interleaves (with Liger and a copy): tells a search that never evaluated the best
    config from one that evaluated it and named another. Per config: both interleaves' times
    and, per seed that had it among its `n`, its rank there and its search-time figures."""
    from tuner.run.store import Store
    cands: dict[str, dict] = {}
    for seed_dir in sorted(out.glob(f"{op_name}_{shape}_*")):
        seed = seed_dir.name.rsplit("_", 1)[1]
        for run_json in seed_dir.rglob("run.json"):
            store = Store(run_json.parent)
            ok = sorted((r for r in store.records() if r.status is Status.OK), key=lambda r: r.search_s)
            named = json.dumps(((store.read_json("summary.json") or {}).get("best") or {}).get("config"),
                               sort_keys=True)
            for rank, r in enumerate(ok[:n]):
                key = json.dumps(r.config.as_dict(), sort_keys=True)
                c = cands.setdefault(key, {"artifact": r.build.artifact, "seen": {}})
                c["seen"][seed] = {"rank": rank, "search_us": round(r.search_s * 1e6, 2),
                                   "own_us": round(r.seconds * 1e6, 2), "named": key == named}
    fns = {}
    for i, c in enumerate(cands.values()):
        k = backend.load(c["artifact"], op)
        fns[f"c{i}"] = (lambda k: lambda: k(*xs, *outs))(k)
    liger = liger_fn(op_name, xs)
    if liger is not None:
        fns["liger"] = liger
    fns["copy"] = copy_fn(op)
    runs = [interleaved(backend, fns, rounds=rounds) for _ in range(2)]
    rows = [{"config": json.loads(key), "us": [round(t[f"c{i}"] * 1e6, 2) for t in runs], "seen": c["seen"]}
            for i, (key, c) in enumerate(cands.items())]
    rows.sort(key=lambda r: min(r["us"]))
    for k in ("liger", "copy"):
        if k in fns:
            rows.append({"peer": k, "us": [round(t[k] * 1e6, 2) for t in runs]})
    return rows


# ---- tuning wall time against @triton.autotune ------------------------------------------

def matmul202():
    """(spec, skeleton, render context, configs) of the 202-config matmul list, 4096^3 bf16."""
    spec = builtin_spec("matmul", "4096x4096x4096", "bf16")
    skeleton = load_skeleton(ROOT / "kernel_templates/matmul/triton.py.j2", ROOT / "bench/triton_matmul202.yaml")
    ctx = {**{k: v for k, v in spec.sizes}, "DTYPE_BYTES": 2, "dtype": "bf16", "op": "matmul", "CORES": 132}
    configs = [c for c in skeleton.space.configs()
               if skeleton.space.check(c, ctx, {"smem_bytes": 232448}) is None]
    return spec, skeleton, ctx, configs


def cmd_autotune(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = "4096x4096x4096"
    spec, skeleton, ctx, configs = matmul202()
    op = load_op(spec)
    result = {"configs": len(configs), "shape": shape, "compile_workers": COMPILE_WORKERS}
    path = out / "gpu_autotune.json"
    if path.is_file():  # parts run in separate commands add to one report
        result = {**json.loads(path.read_text()), **result}
    if args.part in ("all", "autotune"):
        _autotune_part(args, out, skeleton, spec, op, configs, ctx, result)
    if args.part == "winners":
        _winners_part(out, skeleton, op, configs, ctx, result)
        return
    for label, sampler, budget in [("tuner_grid", "grid", len(configs)), ("tuner_tpe60", "tpe", 60)]:
        if args.part not in ("all", label.split("_")[1].rstrip("60")):
            continue
        # The tuner: every config (grid), then TPE with a budget; each run has its own cold cache.
        settings = settings_for(out)
        store = create_run(settings, spec, "cuda", skeleton, sampler, seed=0,
                           command=f"bench/gpu_bench.py autotune ({label})")
        t0 = time.monotonic()
        s = execute(store, settings, budget)
        result[f"{label}_wall_s"] = round(time.monotonic() - t0, 1)
        result[f"{label}_evaluations"] = s["evaluations"]
        result[f"{label}_best_ms"] = round(s["best"]["median_s"] * 1e3, 4) if s["best"] else None
        result[f"{label}_best"] = s["best"]["config"] if s["best"] else None
        result[f"{label}_failures"] = {k: v["count"] for k, v in s["failures"].items()}
        result[f"{label}_timeline"] = s.get("timeline", {})
        # compile seconds over the compile processes: near the wall time, compiling bounds it
        compiles = sorted(r.build.compile_s for r in store.records() if r.build.compile_s)
        if compiles:
            result[f"{label}_compile_s"] = {"sum_per_worker": round(sum(compiles) / COMPILE_WORKERS, 1),
                                            "median": round(compiles[len(compiles) // 2], 2),
                                            "max": round(compiles[-1], 2)}
        if "autotune_wall_s" in result:
            result[f"{label}_speedup_vs_autotune"] = round(result["autotune_wall_s"] / result[f"{label}_wall_s"], 2)
        print(json.dumps(result), flush=True)
        path.write_text(json.dumps(result, indent=1))


def _autotune_part(args, out, skeleton, spec, op, configs, ctx, result) -> None:
    import torch
    import triton

    from tuner.backends.triton_source import load_module
    # @triton.autotune over the same list, cold cache, in this process.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="autotune_cache_", dir=out)
    mod_path = out / "autotune_kernel.py"
    mod_path.write_text(skeleton.render(configs[0], ctx))
    module = load_module(mod_path, "bench_autotune_matmul")
    tuned = triton.autotune(
        configs=[triton.Config({k: c[k] for k in ("BM", "BN", "BK", "GROUP_M")},
                               num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in configs],
        key=["M", "N", "K"])(module.matmul_kernel)
    a, b = (x.cuda() for x in op.make_inputs(1))
    c_out = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")

    def run():
        grid = lambda meta: (triton.cdiv(4096, meta["BM"]) * triton.cdiv(4096, meta["BN"]),)  # noqa: E731
        tuned[grid](a, b, c_out, 4096, 4096, 4096)

    t0 = time.monotonic()
    run()
    torch.cuda.synchronize()
    result["autotune_wall_s"] = round(time.monotonic() - t0, 1)
    best = tuned.best_config
    result["autotune_best"] = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
    result["autotune_best_ms"] = round(triton.testing.do_bench(run, return_mode="median"), 4)
    print(json.dumps(result), flush=True)
    (out / "gpu_autotune.json").write_text(json.dumps(result, indent=1))


def _winners_part(out, skeleton, op, configs, ctx, result) -> None:
    """The winners of the earlier parts (in this --out's report), each timed by both harnesses
    on one GPU in one process, interleaved: the tuner's (CUDA events, L2 flushed, queued
    repetitions) and triton.testing.do_bench. Tells a ranking that differs between @autotune
    and the tuner apart from two GPUs, or two processes, that ran differently."""
    import torch
    import triton

    from tuner.backends.cuda import CudaBackend
    from tuner.backends.triton_source import load_module
    named = {k[:-len("_best")]: v for k, v in result.items() if k.endswith("_best") and isinstance(v, dict)}
    if not named:
        raise SystemExit(f"no winners in {out / 'gpu_autotune.json'}: run the other parts with this --out first")
    a, b = (x.cuda() for x in op.make_inputs(1))
    c_out = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
    backend = CudaBackend(0, cache_dir=str(out / "cache"))
    fns = {}
    for label, want in named.items():
        # autotune's winner names only the params it tuned; the list's config that agrees on them
        config = next(c for c in configs if all(c.as_dict().get(k) == v for k, v in want.items()))
        path = out / f"winner_{label}.py"
        path.write_text(skeleton.render(config, ctx))
        module = load_module(path, f"bench_winner_{label}")
        fns[label] = (str(config), lambda m=module: m.launch(a, b, c_out))
    ours: dict[str, list[float]] = {k: [] for k in fns}
    theirs: dict[str, list[float]] = {k: [] for k in fns}
    for _, fn in fns.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(5):
        for label, (_, fn) in fns.items():
            ours[label] += backend.time_calls(fn, 100)
            theirs[label].append(triton.testing.do_bench(fn, return_mode="median"))
    result["winners_timed"] = {label: {"config": cfg, "tuner_ms": round(statistics.median(ours[label]) * 1e3, 4),
                                       "do_bench_ms": round(statistics.median(theirs[label]), 4)}
                               for label, (cfg, _) in fns.items()}
    print(json.dumps(result["winners_timed"], indent=1), flush=True)
    (out / "gpu_autotune.json").write_text(json.dumps(result, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("ops")
    o.add_argument("--ops", help="comma-separated op names (default: all)")
    o.add_argument("--budget", type=int, default=40, help="configs per tuning run (x2 for matmul, attention)")
    o.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    o.add_argument("--first", action="store_true", help="only the first shape of each op")
    o.add_argument("--cases", help="op:shape pairs instead of the built-in list, e.g. matmul:16x14336x4096")
    o.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    o.add_argument("--languages", default="triton,cuda",
                   help="kernel languages tuned where the library has a skeleton (triton always; cuda: CUDA C++)")
    o.set_defaults(fn=cmd_ops)
    sd = sub.add_parser("seeds", help="the default search with several seeds; the winners timed side by side")
    sd.add_argument("--cases", default="softmax:8192x8192,layernorm:8192x8192", help="op:shape pairs")
    sd.add_argument("--seeds", type=int, default=5)
    sd.add_argument("--budget", type=int, default=40)
    sd.add_argument("--language", default="triton", choices=("triton", "cuda"),
                    help="the library skeleton each seed tunes (cuda: CUDA C++)")
    sd.add_argument("--rounds", type=int, default=10)
    sd.add_argument("--top", type=int, default=0, metavar="N",
                    help="also time every seed's N fastest configs together (did a seed miss the best "
                         "config, or evaluate it and name another?)")
    sd.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    sd.set_defaults(fn=cmd_seeds)
    a = sub.add_parser("autotune")
    a.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    a.add_argument("--part", default="all", choices=["all", "autotune", "grid", "tpe", "winners"],
                   help="run one part (each within a command's time limit); parts add to one report; "
                        "winners: the earlier parts' winners timed by both harnesses on one GPU")
    a.set_defaults(fn=cmd_autotune)
    for sp in (o, a, sd):
        sp.add_argument("--compile-workers", type=int, help="compile processes (default: CPUs - 1)")
    args = p.parse_args()
    global COMPILE_WORKERS
    COMPILE_WORKERS = args.compile_workers or COMPILE_WORKERS
    args.fn(args)


if __name__ == "__main__":
    main()
