"""Hand-written kernel variants timed side by side on one GPU, to decide what a template
should offer as a choice (bf16; the tuner's timing: L2 flushed before each call, repetitions
queued, median; contenders interleaved).

`matmul`: persistent TMA matmul at 4096^3 with and without a flattened tile loop,
`warp_specialize=True` and an epilogue stored in two halves, against torch.matmul (cuBLAS).
`swiglu`: one-tile-per-program and persistent swiglu at 8192x14336, with and without
`eviction_policy="evict_first"`, against torch.compile(mode="max-autotune-no-cudagraphs").

    python bench/kernel_variants.py matmul|swiglu

Prints one line per variant, fastest first. Variants a GPU cannot run (shared memory) are
printed with their error and left out.
"""

import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tuner.backends.cuda import CudaBackend  # noqa: E402


@triton.jit
def matmul_tma(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr, WS: tl.constexpr, SUB: tl.constexpr, FLAT: tl.constexpr):
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_pid_in_group = GROUP_M * num_pid_n
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0), flatten=FLAT,
                         warp_specialize=WS):
        group_id = tile // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        off_m = (first_pid_m + ((tile % num_pid_in_group) % group_size_m)) * BM
        off_n = ((tile % num_pid_in_group) // group_size_m) * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in range(0, tl.cdiv(K, BK)):
            acc = tl.dot(a_desc.load([off_m, kk * BK]), b_desc.load([kk * BK, off_n]), acc)
        if SUB:  # the epilogue in two halves: half the registers live at the store
            c0, c1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            c_desc.store([off_m, off_n], c0.to(tl.bfloat16))
            c_desc.store([off_m, off_n + BN // 2], c1.to(tl.bfloat16))
        else:
            c_desc.store([off_m, off_n], acc.to(tl.bfloat16))


@triton.jit
def swiglu_block(a_ptr, b_ptr, y_ptr, offs, EV: tl.constexpr):
    if EV:
        a = tl.load(a_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        b = tl.load(b_ptr + offs, eviction_policy="evict_first").to(tl.float32)
    else:
        a = tl.load(a_ptr + offs).to(tl.float32)
        b = tl.load(b_ptr + offs).to(tl.float32)
    tl.store(y_ptr + offs, (a * tl.sigmoid(a) * b).to(y_ptr.dtype.element_ty))


@triton.jit
def swiglu_plain(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr, EV: tl.constexpr):
    swiglu_block(a_ptr, b_ptr, y_ptr, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), EV)


@triton.jit
def swiglu_persistent(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr, EV: tl.constexpr, LS: tl.constexpr):
    for blk in tl.range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0), num_stages=LS):
        swiglu_block(a_ptr, b_ptr, y_ptr, blk * BLOCK + tl.arange(0, BLOCK), EV)


def matmul_variants() -> tuple[str, dict]:
    from triton.tools.tensor_descriptor import TensorDescriptor
    M = N = K = 4096
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    ref = a @ b
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for BM, BN, BK, w, s in [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4)]:
        for ws in (False, True):
            for sub in (False, True):
                for flat in (False, True):
                    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                    ad = TensorDescriptor.from_tensor(a, [BM, BK])
                    bd = TensorDescriptor.from_tensor(b, [BK, BN])
                    cd = TensorDescriptor.from_tensor(c, [BM, BN // 2 if sub else BN])
                    name = f"{BM}x{BN}x{BK} w{w} s{s} ws={int(ws)} sub={int(sub)} flat={int(flat)}"

                    def f(ad=ad, bd=bd, cd=cd, BM=BM, BN=BN, BK=BK, w=w, s=s, ws=ws, sub=sub, flat=flat):
                        matmul_tma[(sms,)](ad, bd, cd, M, N, K, BM=BM, BN=BN, BK=BK, GROUP_M=8, WS=ws,
                                           SUB=sub, FLAT=flat, num_warps=w, num_stages=s)
                    try:
                        f()
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 - a variant this GPU cannot run
                        print(f"{name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                        continue
                    err = (c.float() - ref.float()).abs().max().item()
                    if err > 1.0:
                        print(f"{name}: wrong result (max abs error {err})", flush=True)
                        continue
                    fns[name] = f
    return "cublas", fns


def swiglu_variants() -> tuple[str, dict]:
    M, N = 8192, 14336
    a = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    y = torch.empty_like(a)
    n = a.numel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    compiled = torch.compile(lambda a, b: torch.nn.functional.silu(a) * b,
                             mode="max-autotune-no-cudagraphs", dynamic=False)
    compiled(a, b)
    fns = {"torch.compile": lambda: compiled(a, b)}
    for BLOCK, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 16), (16384, 16)]:
        for ev in (False, True):
            fns[f"plain BLOCK {BLOCK} w{w} evict_first={int(ev)}"] = (
                lambda BLOCK=BLOCK, w=w, ev=ev: swiglu_plain[(triton.cdiv(n, BLOCK),)](
                    a, b, y, n, BLOCK=BLOCK, EV=ev, num_warps=w))
    for BLOCK, w, p, ls in [(16384, 16, 16, 2), (4096, 8, 8, 2), (2048, 4, 16, 3)]:
        for ev in (False, True):
            fns[f"persistent BLOCK {BLOCK} w{w} {p}/SM stages {ls} evict_first={int(ev)}"] = (
                lambda BLOCK=BLOCK, w=w, ev=ev, p=p, ls=ls: swiglu_persistent[(sms * p,)](
                    a, b, y, n, BLOCK=BLOCK, EV=ev, LS=ls, num_warps=w))
    return "torch.compile", fns


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("matmul", "swiglu") or not torch.cuda.is_available():
        raise SystemExit(__doc__ if what not in ("matmul", "swiglu") else "needs a CUDA GPU")
    base_name, fns = matmul_variants() if what == "matmul" else swiglu_variants()
    backend = CudaBackend(0, cache_dir=str(Path.home() / ".cache" / "tuner-bench"))
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(8):
        for k, fn in fns.items():
            samples[k] += backend.time_calls(fn, 20)
    base = statistics.median(samples[base_name])
    for k, v in sorted(samples.items(), key=lambda kv: statistics.median(kv[1])):
        m = statistics.median(v)
        print(f"{k:55s} {m * 1e3:.4f} ms   {base / m:.3f}x {base_name}", flush=True)


if __name__ == "__main__":
    main()
