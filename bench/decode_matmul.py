"""The decode matmul (16x14336x4096 bf16 by default) on one NVIDIA GPU: the library's CUDA C++
skeleton at named configs beside cuBLAS (torch.matmul) and a device copy of the op's own bytes,
timed in one interleave as the tuner times (L2 flushed per call, events, median). With
`--profile`, each contender runs twice and nothing is timed: run it under Nsight Compute to see
what bounds each kernel:

    python bench/decode_matmul.py [--shape 16x14336x4096] [--configs JSON_LIST]
    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        -k regex:'skinny_mm|nvjet|gemv|gemm|copy' python bench/decode_matmul.py --profile

A config names only the params that differ from the space's default. Beside them, the read
ceiling: a kernel that only reads b's bytes (16-byte loads, UNROLL in flight a thread, a grid of
BLOCKS a multiprocessor; the fastest of a few shapes is reported), what any kernel that must read
the weight once can reach on this device; and the same bytes read in the column stripes a tiled
matmul reads (what the access pattern alone costs).
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.core.ops import builtin_spec, load_op, render_context  # noqa: E402
from tuner.core.skeleton import library_skeleton  # noqa: E402
from tuner.core.space import Config  # noqa: E402
from tuner.core.values import Status  # noqa: E402

CONFIGS = [  # the fastest TMA-fed configs measured on an H100, then the ring's
    {"FEED": "tma", "BN": 128, "KT": 16, "WARPS": 4, "STAGES": 4},
    {"FEED": "tma", "BN": 64, "KT": 16, "WARPS": 4, "STAGES": 4},
    {"FEED": "tma", "BN": 64, "KT": 16, "WARPS": 4, "STAGES": 3},
    {"FEED": "tma", "BN": 64, "KT": 32, "WARPS": 4, "STAGES": 4},
    {"BN": 64, "KT": 32, "WARPS": 4, "STAGES": 4},
    {"BN": 128, "KT": 16, "WARPS": 8, "STAGES": 3},
    {"BN": 64, "KT": 32, "WARPS": 4, "STAGES": 4, "SPLIT": 2},
]

# The read ceiling: every byte of b read once through 16-byte loads that bypass L1, UNROLL of
# them in flight per thread before any is used; a value that depends on every load is written
# only if it matches a constant, so nothing is optimised away and c is (almost) never written.
READ_ALL = r'''
import tuner.cuda as cuda

SOURCE = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n, unsigned* __restrict__ out)
{
    constexpr int U = {unroll};
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * stride));
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) { const uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
"""


def launch(a, b, c):
    cuda.launch(SOURCE, "read_all", ({blocks},), ({threads},), b, b.numel() * b.element_size() // 16, c)
'''
READ_SHAPES = [(2, 512, 4), (4, 256, 8), (8, 256, 4), (4, 512, 8), (16, 128, 4)]  # blocks / SM, threads, unroll

# The same bytes read as a column-tiled matmul reads them: block (x, y) reads the [K / SPLIT x BN]
# stripe of b at columns x * BN, rows y * K / SPLIT: what the access pattern alone costs.
READ_STRIPES = r'''
import tuner.cuda as cuda

SOURCE = r"""
extern "C" __global__ void read_stripes(const uint4* __restrict__ p, unsigned* __restrict__ out)
{
    constexpr int U = {unroll}, VPR = {bn} * 2 / 16, ROWS = {threads} / VPR, KS = {k} / {split};
    constexpr long long NV = {n} * 2 / 16;
    const int c = threadIdx.x % VPR, r = threadIdx.x / VPR;
    const uint4* base = p + (long long)blockIdx.y * KS * NV + blockIdx.x * VPR + c;
    unsigned acc = 0;
    for (int k = r; k < KS; k += ROWS * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            v[u] = make_uint4(0, 0, 0, 0);
            if (k + u * ROWS < KS)
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(base + (k + u * ROWS) * NV));
        }
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
"""


def launch(a, b, c):
    cuda.launch(SOURCE, "read_stripes", ({n} // {bn}, {split}), ({threads},), b, c)
'''
STRIPE_SHAPES = [(64, 1, 128, 8), (64, 1, 256, 8), (128, 2, 256, 8), (256, 4, 256, 8), (512, 4, 256, 8),
                 (1024, 8, 256, 8)]  # BN, SPLIT, threads, unroll


def fill(template: str, **values) -> str:
    """A reader's launch module: each {name} of the template replaced by its value."""
    for k, v in values.items():
        template = template.replace("{" + k + "}", str(v))
    return template


def main() -> None:
    import torch

    from tuner.backends.cuda import CudaBackend
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="16x14336x4096")
    ap.add_argument("--configs", help="JSON list of configs (params that differ from the default)")
    ap.add_argument("--profile", action="store_true", help="run each contender twice, untimed (for ncu)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--timing", default="tuner", choices=("tuner", "memset", "queued"),
                    help="tuner: as the tuner times (a read of a buffer larger than the L2 before each call, "
                         "which leaves clean lines); memset: a 256 MiB memset before each call instead (the L2 "
                         "left full of dirty lines, as triton.testing.do_bench flushes); queued: 20 calls back "
                         "to back between two events, no flush (a forward's view)")
    args = ap.parse_args()
    spec = builtin_spec("matmul", args.shape, "bf16")
    op = load_op(spec)
    skeleton = library_skeleton("matmul", "cuda")
    backend = CudaBackend(0, language="cuda")
    ctx = {**render_context(op), **backend.render_context(op)}
    xs = [backend.to_device(x) for x in op.make_inputs(12345)]
    M, N = op.sizes["M"], op.sizes["N"]
    c = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    ref = torch.matmul(xs[0].float(), xs[1].float())
    fns, notes = {}, {}
    work = Path(tempfile.mkdtemp(prefix="decode_mm_"))
    for i, want in enumerate(json.loads(args.configs) if args.configs else CONFIGS):
        config = Config.of({**skeleton.space.default_config().as_dict(), **want})
        name = "ours " + " ".join(f"{k}={v}" for k, v in want.items())
        why = skeleton.space.check(config, ctx, backend.limits())
        if why:
            notes[name] = f"not in the space: {why}"
            continue
        build = backend.compile(skeleton.render(config, ctx), spec, str(work / str(i)), 300.0)
        if build.status is not Status.OK:
            notes[name] = f"{build.status.name}: {build.error[:200]}"
            continue
        fn = backend.load(build.artifact, op)
        fn(*xs, c)
        err = float((c.float() - ref).abs().max())
        notes[name] = f"max |err| {err:.3g}"
        fns[name] = (lambda fn: lambda: fn(*xs, c))(fn)
    fns["cuBLAS (torch.matmul)"] = lambda: torch.matmul(xs[0], xs[1], out=c)
    cores = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")
    K = op.sizes["K"]
    readers = [(f"read ceiling: {per_sm} blocks/SM x {threads} threads, {unroll} loads in flight",
                fill(READ_ALL, unroll=unroll, blocks=per_sm * cores, threads=threads))
               for per_sm, threads, unroll in READ_SHAPES]
    readers += [(f"read in stripes: BN {bn}, SPLIT {split} ({N // bn * split} blocks x {threads} threads)",
                 fill(READ_STRIPES, unroll=unroll, bn=bn, threads=threads, k=K, split=split, n=N))
                for bn, split, threads, unroll in STRIPE_SHAPES
                if N % bn == 0 and K % split == 0 and bn * 2 // 16 <= threads]  # a whole row's chunks a pass
    for j, (name, source) in enumerate(readers):
        build = backend.compile(source, spec, str(work / f"read{j}"), 300.0)
        if build.status is not Status.OK:
            notes[name] = f"{build.status.name}: {build.error[:200]}"
            continue
        fns[name] = (lambda fn: lambda: fn(xs[0], xs[1], sink))(backend.load(build.artifact, op))
    half = int(op.bytes // 2)
    src = torch.empty(half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    fns["copy of its bytes"] = lambda: dst.copy_(src)
    if args.profile:
        for f in fns.values():
            f()
            f()
        torch.cuda.synchronize()
        print(json.dumps(notes, indent=1))
        return
    for f in fns.values():
        for _ in range(3):
            f()
    backend.sync()
    samples = {k: [] for k in fns}
    dirty = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    for _ in range(args.rounds):
        for k, f in fns.items():
            if args.timing == "queued":
                samples[k].extend(t / 20 for t in backend.time_calls(lambda: [f() for _ in range(20)], 10))
            elif args.timing == "memset":
                pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                         for _ in range(10)]
                for start, end in pairs:
                    dirty.zero_()
                    start.record()
                    f()
                    end.record()
                torch.cuda.synchronize()
                samples[k].extend(start.elapsed_time(end) * 1e-3 for start, end in pairs)
            else:
                samples[k].extend(backend.time_calls(f, 10))
    t = {k: statistics.median(v) for k, v in samples.items()}
    copy = t["copy of its bytes"]
    print(f"\nmatmul {args.shape} bf16, {torch.cuda.get_device_name()}, median of {args.rounds * 10}, "
          f"timing {args.timing}\n")
    print("| contender | us | % of copy | vs cuBLAS | note |\n| --- | --- | --- | --- | --- |")
    for k in sorted(t, key=t.get):
        print(f"| {k} | {t[k] * 1e6:.1f} | {100 * copy / t[k]:.1f} | {t['cuBLAS (torch.matmul)'] / t[k]:.3f} | "
              f"{notes.get(k, '')} |")
    for k, v in notes.items():
        if k not in t:
            print(f"| {k} | - | - | - | {v} |")


if __name__ == "__main__":
    main()
