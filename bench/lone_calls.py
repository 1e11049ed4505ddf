"""What the history check's factor must allow: honest kernels' lone calls against their median.

The history check (tuner/exec/measure.py) flags a kernel whose fastest lone call on buffers it
has never seen is more than the backend's `history_factor` times its timed median. A kernel
that keeps part of its result between calls gains less than the factor unseen, so the factor
should be as small as honest kernels allow. This measures that: the library's own skeletons
(honest by construction), at the default config and a few random valid ones per case, each
measured as the benchmark worker measures a candidate, the check's figure (the fastest clean
lone call of its first round) over the timed median, per case and overall.

    python bench/lone_calls.py --backend cpu [--configs 4] [--cases softmax:37x1000,...]
    python bench/lone_calls.py --backend cuda --dtype bf16          # on a GPU machine
    python bench/lone_calls.py --backend cuda --language cuda --dtype bf16  # the CUDA C++ library
    python bench/lone_calls.py --backend cuda --module k.py --cases matmul:2048x2048x2048
    python bench/lone_calls.py --backend cuda --language cuda --cases attention:4x8x1024x128 --min-hold-ms 0

`--module`: a launch module (or C source) of one's own instead of the library's configs: what a
kernel that keeps part of its result between calls gains, to compare with the factor.
`--min-hold-ms`: the device held busy at least that long before each lone call (a GPU backend's
`min_hold_s`, 2 ms unless told): 0 shows what lone calls read with only the host's recent launch
time held (TMA attention: slower, the host's launch on new buffers not covered).
"""

import argparse
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.backends import get_backend  # noqa: E402
from tuner.core.ops import builtin_spec, render_context  # noqa: E402
from tuner.core.settings import Settings  # noqa: E402
from tuner.core.skeleton import library_skeleton, load_skeleton  # noqa: E402
from tuner.core.values import Config, Status  # noqa: E402
from tuner.exec import measure  # noqa: E402

CASES = {
    "cpu": "softmax:37x1000,softmax:4096x1024,rmsnorm:512x1024,layernorm:256x4096,matmul:256x256x256",
    "cuda": ("softmax:8192x8192,softmax:1024x1024,rmsnorm:8192x8192,rmsnorm:256x1024,layernorm:32768x4096,"
             "add_rmsnorm:4096x8192,swiglu:4096x28672,rope:4096x32x128,cross_entropy:4096x32000,"
             "matmul:4096x4096x4096,matmul:16x14336x4096,attention:4x32x4096x128"),
}
# The CUDA C++ library (language cuda) at the same shapes where it has a skeleton: its matmul
# is the decode one (M <= 16); attention also at a ~40 us shape, where honest configs were seen
# SUSPECT by the history check.
CUDA_CPP = ("softmax:8192x8192,softmax:1024x1024,rmsnorm:8192x8192,rmsnorm:256x1024,layernorm:32768x4096,"
            "add_rmsnorm:4096x8192,swiglu:4096x28672,rope:4096x32x128,cross_entropy:4096x32000,"
            "matmul:16x14336x4096,attention:4x8x1024x128,attention_causal:4x32x4096x128")
LANGUAGE = {"cpu": "c", "cuda": "triton"}


def configs(skeleton, context, limits, n: int, rng: random.Random) -> list:
    """The default (repaired to validity) and up to `n` random valid configs."""
    space = skeleton.space
    default = space.default_config()
    if space.check(default, context, limits) is not None:
        default = space.repair(default, context, limits)
    out = [default] if default is not None else []
    for _ in range(200 * n):
        if len(out) > n:
            break
        c = Config.of({p.name: rng.choice(p.values) for p in space.params})
        if c not in out and space.check(c, context, limits) is None:
            out.append(c)
    return out


def watch_lone_calls(backend) -> list[tuple[float, bool]]:
    """A list that holds, after each `measure.measure` on `backend`, the history check's lone
    calls (seconds, clean) of its first round; the backend's factor set so high that no kernel
    is judged here (one round, every figure kept). Process-wide: for a measuring script."""
    backend.history_factor = math.inf
    calls: list[tuple[float, bool]] = []
    plain, plain_many = backend.time_call, backend.time_calls

    def time_call(fn, before=None):
        t = plain(fn, before)
        calls.append((t, getattr(backend, "last_call_clean", True)))
        return t

    def time_calls(fn, n, before=None):  # the calls on seen buffers before each lone call: not lone
        kept = len(calls)
        try:
            return plain_many(fn, n, before)
        finally:
            del calls[kept:]

    backend.time_call, backend.time_calls = time_call, time_calls
    real_history = measure.check_history
    lone: list[tuple[float, bool]] = []

    def history(*args):
        calls.clear()
        try:
            return real_history(*args)
        finally:
            lone[:] = calls

    measure.check_history = history
    return lone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", choices=sorted(CASES))
    ap.add_argument("--dtype", default=None, help="default: fp32 on cpu, bf16 on cuda")
    ap.add_argument("--cases", default=None)
    ap.add_argument("--configs", type=int, default=4, help="random valid configs per case, besides the default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--module", help="a kernel source to measure instead of the library's configs")
    ap.add_argument("--language", default=None, help="cuda backend: triton (default) or cuda (CUDA C++)")
    ap.add_argument("--min-hold-ms", type=float, default=None,
                    help="cuda backend: hold the device busy at least this long before each lone call "
                         "(default: the backend's, 2 ms; 0: only twice the host's recent launch time)")
    a = ap.parse_args()
    dtype = a.dtype or ("fp32" if a.backend == "cpu" else "bf16")
    language = a.language or LANGUAGE[a.backend]
    options = {"language": language} if a.backend == "cuda" else {}
    if a.backend == "cuda" and a.min_hold_ms is not None:
        options["min_hold_s"] = a.min_hold_ms * 1e-3
    backend, settings = get_backend(a.backend, 0, **options), Settings()
    if hasattr(backend, "bench_env"):  # as the benchmark worker runs
        import os
        os.environ.update(backend.bench_env(dict(os.environ)))
    lone = watch_lone_calls(backend)
    rng = random.Random(a.seed)
    ratios: list[float] = []
    hold = getattr(backend, "min_hold_s", None)
    print(f"{a.backend} ({backend.device_info(peaks=False).name}), {language}, {dtype}"
          + (f", lone calls held >= {hold * 1e3:g} ms" if hold is not None else "") + "\n")
    print("| case | config | median | lone calls (clean) | check's figure / median |\n|---|---|---|---|---|")
    default_cases = CUDA_CPP if language == "cuda" else CASES[a.backend]
    for case in (a.cases or default_cases).split(","):
        op_name, shape = case.split(":")
        spec = builtin_spec(op_name, shape, dtype)
        op = measure.load_op(spec)
        context = {**render_context(op), **backend.render_context(op)}
        if a.module:  # a template of its own, with a one-point space (as tests/test_redteam.py renders one)
            folder = Path(tempfile.mkdtemp())
            (folder / "k.j2").write_text(Path(a.module).read_text())
            (folder / "k.yaml").write_text(f"language: {language}\nsizes: {list(op.sizes)}\n"
                                           f"params:\n  V: [1]\n")
            own = load_skeleton(folder / "k.j2", folder / "k.yaml")
            sources = [(Path(a.module).name, own.render(own.space.default_config(), context))]
        else:
            skeleton = library_skeleton(op_name, language)
            sources = [(config, skeleton.render(config, context))
                       for config in configs(skeleton, context, backend.limits(), a.configs, rng)]
        for config, source in sources:
            build = backend.compile(source, spec, tempfile.mkdtemp(), 300)
            if build.status is not Status.OK:
                print(f"| {case} | {config} | {build.status.value} | | {(build.error or '')[:80]} |")
                continue
            lone.clear()
            m = measure.measure(backend, build.artifact, spec, settings)
            if m.status is not Status.OK or not lone:
                print(f"| {case} | {config} | {m.status.value} | | {m.detail[:80]} |")
                continue
            median = statistics.median(m.samples)
            clean = [t for t, c in lone if c]
            ratio = min(clean or [t for t, _ in lone]) / median
            ratios.append(ratio)
            shown = ", ".join(f"{t * 1e6:.1f}{'' if c else '*'}" for t, c in lone)
            print(f"| {case} | {config} | {median * 1e6:.1f} us | {shown} us | {ratio:.3f} |", flush=True)
    if ratios:
        ratios.sort()
        print(f"\n{len(ratios)} kernels: check's figure / median: median {statistics.median(ratios):.3f}, "
              f"p95 {ratios[min(len(ratios) - 1, int(0.95 * len(ratios)))]:.3f}, max {ratios[-1]:.3f} "
              f"(* a lone call the host may have delayed: `last_call_clean`)")


if __name__ == "__main__":
    main()
