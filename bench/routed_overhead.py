"""What routing a call through the patch costs under torch.compile, on this machine.

1. One call of a custom op registered the two ways torch offers, the op returning a copy of its
   input: `torch.library.Library` with one kernel for every dispatch key (how
   `tuner::routed` is registered) and `torch.library.custom_op` (whose Python autograd layer
   runs on every call), beside the plain Python function.
2. bench/models/qwen2_layer_decode.py at hidden 256 (4 heads, 2 KV heads, intermediate 512,
   batch 4, a 64-token cache), fp32 on the cpu backend: rmsnorm tuned at the layer's norm
   shape, exported, and the layer timed compiled (torch.compile, default mode) and patched +
   compiled, in turns in one process. An --out that holds an export already is timed again on
   that table (to compare two versions of the patch on the same tuned kernel).
3. With --db (an exported tuning.json): for each of its entries, the host time of one routed
   call, layer by layer, at the entry's sizes on its device: the custom op, the patch's call,
   the runtime kernel's launch, the backend's launch of the launch module, and torch's own
   definition of the op. Calls queued back to back and one synchronisation at the end: the
   time per call a launch-bound forward feels (the device kernels are shorter than the host's
   part of each call).

    python bench/routed_overhead.py [--rounds 30] [--out DIR] [--db export/tuning.json [--only-steps]]
"""

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMALL = "HIDDEN, HEADS, KV_HEADS, INTER, BATCH, CONTEXT = 256, 4, 2, 512, 4, 64"


def interleaved(fns: dict, rounds: int) -> dict[str, float]:
    """Median seconds per call, the functions called in turns (one warm-up call each). Here, not
    tuner.model.verify's: the script also times trees older than that one."""
    import statistics
    samples = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def per_call(fn, n: int = 20000) -> float:
    for _ in range(100):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def dispatch() -> None:
    import torch
    lib = torch.library.Library("tuner_bench", "DEF")
    lib.define("plain(Tensor x) -> Tensor")
    lib.impl("plain", lambda x: x.clone(), "CompositeExplicitAutograd")

    @torch.library.custom_op("tuner_bench::wrapped", mutates_args=())
    def wrapped(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    x = torch.randn(4, 4)
    with torch.no_grad():
        rows = {"torch.library.Library, one kernel for every key": per_call(lambda: torch.ops.tuner_bench.plain(x)),
                "torch.library.custom_op": per_call(lambda: wrapped(x)),
                "the Python function": per_call(lambda: x.clone())}
    print("| one call of | us |\n| --- | --- |")
    for k, v in rows.items():
        print(f"| {k} | {v * 1e6:.2f} |")


def small_layer(out: Path, rounds: int) -> None:
    import torch

    from tuner.core.ops import builtin_spec
    from tuner.core.settings import Settings
    from tuner.core.skeleton import library_skeleton
    from tuner.run.tune import create_run, execute
    from tuner.serve.db import TuningDB, export
    from tuner.serve.patch import patched_copy
    from tuner.serve.runtime import Table
    src = (ROOT / "bench/models/qwen2_layer_decode.py").read_text()
    big = "HIDDEN, HEADS, KV_HEADS, INTER, BATCH, CONTEXT = 4096, 32, 8, 14336, 16, 4096"
    if big not in src:
        raise SystemExit("bench/models/qwen2_layer_decode.py no longer names its sizes on one line: update SMALL")
    model_file = out / "small_decode.py"
    model_file.write_text(src.replace(big, SMALL))
    spec = importlib.util.spec_from_file_location("small_decode", model_file)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    if not (out / "export" / "tuning.json").is_file():  # kept: two trees timed on one table
        settings = Settings(runs_dir=str(out / "runs"), cache_dir=str(out / "cache"), compile_workers=1)
        execute(create_run(settings, builtin_spec("rmsnorm", "4x256", "fp32"), "cpu", library_skeleton("rmsnorm", "c"),
                           "guided", 0), settings, 4)
        db = TuningDB(out / "db.json")
        db.collect([out / "runs"])
        db.save()
        export(db, out / "export")
    table = Table.load(out / "export" / "tuning.json", cache_dir=str(out / "cache"),
                       serve_slower=True)  # what a routed call costs, whether or not it pays
    model, xs = m.get_model().eval(), m.get_inputs()
    with torch.no_grad():
        patched = patched_copy(model, table)
        fns = {}
        for name, mod in (("torch.compile", model), ("patched + torch.compile", patched)):
            c = torch.compile(mod)
            c(*xs)
            fns[name] = (lambda c: lambda: c(*xs))(c)
        t = interleaved(fns, rounds)
    print(f"\nthe decode layer at hidden 256, fp32, cpu ({dict(patched.tuner_patch.stats)} routed, fell back)\n")
    print("| variant | us per forward |\n| --- | --- |")
    for k, v in t.items():
        print(f"| {k} | {v * 1e6:.1f} |")


def steps(db: str, n: int = 2000) -> None:
    import torch

    from tuner.core.ops import builtin_spec, load_op
    from tuner.serve import calls, patch
    from tuner.serve.runtime import Table
    table = Table.load(db, serve_slower=True)  # every entry's routed call, whether or not it pays
    p = patch.Patched(torch.nn.Module(), table, functions=False)
    op_fn = calls.custom_op()
    print("\n| entry | backend | the custom op | the patch's call | the kernel's launch | the backend's launch | "
          "torch's definition |\n| --- | --- | --- | --- | --- | --- | --- |")
    for e in table.entries:
        if e["op"] not in calls.SIZES:
            continue
        k = table.kernel(e["op"], e["sizes"], e["dtype"])
        if k is None:
            print(f"| {e['op']} {e['sizes']} {e['dtype']} | - | not served here | | | | |")
            continue
        where = k._device or k.backend.to_device(torch.empty(0)).device
        spec = builtin_spec(e["op"], "x".join(str(v) for v in e["sizes"].values()), e["dtype"])
        xs = [x.to(where) for x in load_op(spec).make_inputs(1)]
        outs = k.outputs(xs)
        sync = torch.cuda.synchronize if where.type == "cuda" else (lambda: None)

        def host(fn):
            fn()
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            return f"{(time.perf_counter() - t0) / n * 1e6:.1f} us"
        with torch.no_grad():
            row = [host(lambda: op_fn(e["op"], p.id, xs)), host(lambda: p.call(e["op"], xs)),
                   host(lambda: k._launch(xs, outs)), host(lambda: k.backend.launch(k.fn, xs + outs)),
                   host(lambda: calls.TORCH[e["op"]](*xs))]
        print(f"| {e['op']} {spec.key} | {e.get('backend', '?')} {e.get('language', '')} | " + " | ".join(row) + " |")
    p.undo()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", help="where the small layer's run, db and export go (default: a temporary folder)")
    ap.add_argument("--db", help="an exported tuning.json: its entries' routed calls, step by step")
    ap.add_argument("--only-steps", action="store_true", help="with --db: only that part")
    a = ap.parse_args()
    if a.db and a.only_steps:
        return steps(a.db)
    out = Path(a.out or tempfile.mkdtemp(prefix="routed_overhead_"))
    out.mkdir(parents=True, exist_ok=True)
    dispatch()
    small_layer(out, a.rounds)
    if a.db:
        steps(a.db)


if __name__ == "__main__":
    main()
