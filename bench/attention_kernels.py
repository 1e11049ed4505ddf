"""Flash attention on one NVIDIA GPU: the library's skeletons at named configs (CUDA C++ and
Triton) beside torch's scaled_dot_product_attention with each backend it has here (cuDNN,
flash), timed in one interleave as the tuner times (L2 flushed per call, events, median; each round
starts one contender later, `gpu_bench.interleaved`),
with each kernel's error against a float32 reference on the same inputs:

    python bench/attention_kernels.py [--op attention|attention_causal] [--shape 4x32x4096x128]
        [--cuda JSON_LIST] [--triton JSON_LIST] [--rounds 10]

A config names only the params that differ from the space's default; without --cuda, every
config of the CUDA C++ space that fits the device. With `--profile`, each contender runs twice
and nothing is timed (for Nsight Compute).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_bench import interleaved  # noqa: E402

from tuner.core.ops import builtin_spec, load_op, render_context  # noqa: E402
from tuner.core.skeleton import library_skeleton  # noqa: E402
from tuner.core.space import Config  # noqa: E402
from tuner.core.values import Status  # noqa: E402

TRITON = [{"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "DESC": True}]


def _contenders(language, wants, op_name, spec, op, backend_cls, work):
    """(name, launch function, note) for each wanted config of the library's `language`
    skeleton; a config that is not in the space or does not build gets a note instead."""
    skeleton = library_skeleton(op_name, language)
    backend = backend_cls(0, language=language)
    ctx = {**render_context(op), **backend.render_context(op)}
    if wants is None:
        wants = [c.as_dict() for c in skeleton.space.configs()
                 if skeleton.space.check(c, ctx, backend.limits()) is None]
    out = []
    for i, want in enumerate(wants):
        config = Config.of({**skeleton.space.default_config().as_dict(), **want})
        name = f"{language} " + " ".join(f"{k}={v}" for k, v in want.items())
        why = skeleton.space.check(config, ctx, backend.limits())
        if why:
            out.append((name, None, f"not in the space: {why}"))
            continue
        build = backend.compile(skeleton.render(config, ctx), spec, str(work / f"{language}{i}"), 300.0)
        if build.status is not Status.OK:
            out.append((name, None, f"{build.status.name}: {build.error[:300]}"))
            continue
        out.append((name, backend.load(build.artifact, op), ""))
    return backend, out


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tuner.backends.cuda import CudaBackend
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="attention", choices=["attention", "attention_causal"])
    ap.add_argument("--shape", default="4x32x4096x128")
    ap.add_argument("--cuda", help="JSON list of CUDA C++ configs (default: every one that fits)")
    ap.add_argument("--triton", help="JSON list of Triton configs", default=json.dumps(TRITON))
    ap.add_argument("--profile", action="store_true", help="run each contender twice, untimed (for ncu)")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    causal = args.op == "attention_causal"
    spec = builtin_spec(args.op, args.shape, "bf16")
    op = load_op(spec)
    work = Path(tempfile.mkdtemp(prefix="attention_"))
    backend, contenders = _contenders("cuda", json.loads(args.cuda) if args.cuda else None, args.op, spec, op,
                                      CudaBackend, work)
    _, tri = _contenders("triton", json.loads(args.triton), args.op, spec, op, CudaBackend, work)
    xs = [backend.to_device(x) for x in op.make_inputs(12345)]
    o = torch.empty_like(xs[0])
    ref = F.scaled_dot_product_attention(*(x.float() for x in xs), is_causal=causal)
    fns, notes = {}, {}
    for name, fn, note in contenders + tri:
        if fn is None:
            notes[name] = note
            continue
        o.fill_(float("nan"))
        fn(*xs, o)
        torch.cuda.synchronize()
        err = float((o.float() - ref).norm() / ref.norm())
        notes[name] = f"rel. error {err:.2e}" + ("" if err < 1e-2 else " WRONG")
        if err < 1e-2:
            fns[name] = (lambda fn: lambda: fn(*xs, o))(fn)
    for label, kind in (("SDPA (default)", None), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                        ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(kind=kind):
            if kind is None:
                return F.scaled_dot_product_attention(*xs, is_causal=causal)
            with sdpa_kernel([kind]):
                return F.scaled_dot_product_attention(*xs, is_causal=causal)
        try:
            err = float((sdpa().float() - ref).norm() / ref.norm())
        except RuntimeError as e:
            notes[label] = f"not available: {str(e)[:120]}"
            continue
        notes[label] = f"rel. error {err:.2e}"
        fns[label] = sdpa
    if args.profile:
        for f in fns.values():
            f()
            f()
        torch.cuda.synchronize()
        print(json.dumps(notes, indent=1))
        return
    t = interleaved(backend, fns, args.rounds, 5)
    B, H, S, D = (op.sizes[k] for k in "BHSD")
    flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    best_sdpa = min(v for k, v in t.items() if k.startswith("SDPA"))
    print(f"\n{args.op} {args.shape} bf16, {torch.cuda.get_device_name()}, median of {args.rounds * 5} calls\n")
    print("| contender | ms | TFLOP/s | vs best SDPA | note |\n| --- | --- | --- | --- | --- |")
    for k in sorted(t, key=t.get):
        print(f"| {k} | {t[k] * 1e3:.4f} | {flops / t[k] / 1e12:.0f} | {best_sdpa / t[k]:.3f} | {notes.get(k, '')} |")
    for k, v in notes.items():
        if k not in t:
            print(f"| {k} | - | - | - | {v} |")


if __name__ == "__main__":
    main()
