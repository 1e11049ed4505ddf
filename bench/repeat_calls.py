"""Call after call: named configs of a library CUDA C++ skeleton on one NVIDIA GPU, each called
--calls times on three input sets (the L2 flushed before every other call), every output
compared with a float32 reference: a race shows in some calls only, where one verification
passes. Also the host time of a lone launch on buffers the launcher has not seen (the GPU idle).

    python bench/repeat_calls.py --op matmul --shape 16x14336x4096 --calls 150 \\
        --configs '[{"FEED": "tma", "BN": 32, "KT": 16, "WARPS": 4, "STAGES": 4, "SPLIT": 4}]'

A config names only the params that differ from the space's default; "_patch": [[old, new],
...] replaces text in its rendered source first (to try a change without editing the template).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.core.ops import builtin_spec, load_op, render_context  # noqa: E402
from tuner.core.skeleton import library_skeleton  # noqa: E402
from tuner.core.space import Config  # noqa: E402
from tuner.core.values import Status  # noqa: E402


def main() -> None:
    import torch

    from tuner.backends.cuda import CudaBackend
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="matmul")
    ap.add_argument("--shape", default="16x14336x4096")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--configs", required=True, help="JSON list of configs")
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--atol", type=float, default=3.0, help="an element further off than this is wrong")
    args = ap.parse_args()
    spec = builtin_spec(args.op, args.shape, args.dtype)
    op = load_op(spec)
    sk = library_skeleton(args.op, "cuda")
    backend = CudaBackend(0, language="cuda")
    ctx = {**render_context(op), **backend.render_context(op)}
    sets = []
    for seed in range(3):
        xs = [backend.to_device(x) for x in op.make_inputs(100 + seed)]
        sets.append((xs, [r.float() for r in op.torch_impl([x.float() for x in xs])]))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{args.op} {args.shape} {args.dtype}, {torch.cuda.get_device_name()}, {args.calls} calls each\n")
    print("| config | calls wrong | elements wrong | worst error | host time of a lone launch on new buffers (us) |")
    print("| --- | --- | --- | --- | --- |")
    for want in json.loads(args.configs):
        patches = want.pop("_patch", [])
        config = Config.of({**sk.space.default_config().as_dict(), **want})
        name = " ".join(f"{k}={v}" for k, v in want.items()) + (" (patched)" if patches else "")
        why = sk.space.check(config, ctx, backend.limits())
        source = sk.render(config, ctx)
        for old, new in patches:
            why = why or (None if old in source else f"patch text not in the source: {old[:60]!r}")
            source = source.replace(old, new)
        build = None if why else backend.compile(source, spec, tempfile.mkdtemp(), 300.0)
        if why or build.status is not Status.OK:
            print(f"| {name} | {why or build.status.name + ': ' + build.error[:150]} | | | |")
            continue
        fn = backend.load(build.artifact, op)
        wrong_calls = wrong = 0
        worst = 0.0
        for i in range(args.calls):
            xs, refs = sets[i % 3]
            outs = [torch.full_like(r, float("nan"), dtype=xs[0].dtype) for r in refs]
            if i % 2:
                flush.zero_()
            fn(*xs, *outs)
            torch.cuda.synchronize()
            n = 0
            for o, r in zip(outs, refs):
                e = (o.float() - r).abs().nan_to_num(float("inf"))
                n += int((e > args.atol).sum())
                worst = max(worst, float(e.max()))
            wrong += n
            wrong_calls += n > 0
        host = []
        for _ in range(20):
            ys = [x.clone() for x in sets[0][0]]
            outs = [torch.empty_like(r, dtype=ys[0].dtype) for r in sets[0][1]]
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn(*ys, *outs)
            host.append(time.perf_counter() - t)
            torch.cuda.synchronize()
        print(f"| {name} | {wrong_calls} of {args.calls} | {wrong} | {worst:.3g} | {statistics.median(host) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
