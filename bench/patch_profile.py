"""Where a patched model's time goes under torch.compile: the model file's forward, plain and
patched with an exported table, each compiled (--mode, max-autotune-no-cudagraphs by default), run under
torch.profiler. Prints per variant the wall time per forward, the device time per forward, the
host time spent inside the routed calls, the device synchronisations torch saw, and the top
kernels by device time and the top host events: what `tuner verify`'s end-to-end figures do not break down.
With --eager, the eager forward instead: plain, patched with the module routes only, patched
with the function routes too, timed in turns in one process, then the Python functions that took the most host time in the patched forward
(cProfile): where a patched eager forward's extra host time goes.

    python bench/patch_profile.py MODEL_FILE --db export/tuning.json [--dtype bf16] [--iterations 20] [--eager] [--top 12]
"""

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.model.profile import _prepared, load_model  # noqa: E402
from tuner.serve.patch import patched_copy  # noqa: E402
from tuner.serve.runtime import Table  # noqa: E402


def model_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments of a bench on a model file and its exported table."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--db", required=True, help="an exported tuning.json")
    ap.add_argument("--dtype", default="bf16")
    return ap


def prepared(model_file: str, dtype: str):
    """(device, its synchronisation, the model file's model and inputs on it in `dtype`)."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model, inputs = load_model(model_file)
    model, xs = _prepared(model, inputs, device, dtype)
    return device, sync, model, xs


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    ap = model_arguments(__doc__)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--mode", default="max-autotune-no-cudagraphs",
                    help="torch.compile's mode (\"default\" compiles in a fraction of the time)")
    ap.add_argument("--eager", action="store_true", help="break the patched eager forward down instead")
    ap.add_argument("--top", type=int, default=12, help="kernels and host events listed per variant")
    args = ap.parse_args()
    device, sync, model, xs = prepared(args.model, args.dtype)
    table = Table.load(args.db)
    if args.eager:
        return eager_breakdown(model, xs, table, sync, args.iterations)
    variants = {}
    with torch.no_grad():
        patched = patched_copy(model, table)
        print("modules replaced:", dict(patched.tuner_patch.modules))
        for name, m in (("torch.compile", model), ("patched + torch.compile", patched)):
            torch._dynamo.reset()
            c = torch.compile(m, mode=args.mode)
            c(*xs)
            sync()
            variants[name] = (lambda c: lambda: c(*xs))(c)
        variants["eager"] = lambda: model(*xs)
        variants["patched eager"] = lambda: patched(*xs)
        for name, fn in variants.items():
            walls = []
            for _ in range(args.iterations):
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                walls.append(time.perf_counter() - t0)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as seen, profile(activities=activities) as prof:
                warnings.simplefilter("always")
                for _ in range(args.iterations):
                    fn()
                sync()
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
            avg = prof.key_averages()
            dev = [e for e in avg if getattr(e, "self_device_time_total", 0) > 0]
            dev_total = sum(e.self_device_time_total for e in dev) / args.iterations
            routed = [e for e in avg if e.key == "tuner::routed"]
            routed_cpu = sum(e.cpu_time_total for e in routed) / args.iterations
            syncs = [str(w.message)[:120] for w in seen if "synchroniz" in str(w.message)]
            print(f"\n## {name}: wall {statistics.median(walls) * 1e6:.1f} us per forward (median of "
                  f"{args.iterations}), device {dev_total:.1f} us, in tuner::routed (host) {routed_cpu:.1f} us, "
                  f"synchronisations seen {len(syncs)}" + (f" (first: {syncs[0]})" if syncs else ""))
            print("| kernel | calls per forward | device us per forward |\n| --- | --- | --- |")
            for e in sorted(dev, key=lambda e: -e.self_device_time_total)[:args.top]:
                print(f"| {e.key[:90]} | {e.count / args.iterations:g} | {e.self_device_time_total / args.iterations:.1f} |")
            print("\n| host event | calls per forward | host us per forward (self) |\n| --- | --- | --- |")
            for e in sorted(avg, key=lambda e: -e.self_cpu_time_total)[:args.top]:
                print(f"| {e.key[:90]} | {e.count / args.iterations:g} | {e.self_cpu_time_total / args.iterations:.1f} |")


def eager_breakdown(model, xs, table, sync, iterations: int) -> None:
    import cProfile
    import io
    import pstats

    import torch

    from tuner.model.verify import interleaved
    with torch.no_grad():
        modules_only = patched_copy(model, table, functions=False)
        both = patched_copy(model, table, functions=True)
        print("modules replaced:", dict(both.tuner_patch.modules))
        fns = {"eager": lambda: model(*xs), "patched, module routes only": lambda: modules_only(*xs),
               "patched, module and function routes": lambda: both(*xs)}
        medians = interleaved(fns, sync, iterations)
        print("\n| variant | us per forward | vs eager |\n| --- | --- | --- |")
        for name, s in medians.items():
            print(f"| {name} | {s * 1e6:.1f} | {medians['eager'] / s:.2f}x |")
        print("routed:", dict(both.tuner_patch.stats))
        for name, m in (("eager", model), ("patched, module and function routes", both)):
            sync()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(iterations):
                m(*xs)
            sync()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
            print(f"\n## {name}: cProfile, {iterations} forwards, by own time\n{out.getvalue()}")


if __name__ == "__main__":
    main()
