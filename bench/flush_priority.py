"""Does a load's L2 eviction priority let a kernel keep its inputs across the tuner's cache flush?

The tuner reads a buffer larger than the L2 before each timed call (`triton_device.evict`), with
normal priority. A kernel that loads its inputs `evict_last` (a legal Triton and PTX hint) may
leave lines that a normal-priority flush does not displace; with the timing's few rotated buffer
sets fitting in the L2 together, the next calls on them would then read from the L2. This times a
streaming kernel (y = 2x, bf16) over three rotated sets under each load priority, timed as the
tuner times, beside the same kernel on buffers never seen before (a lone call: what the history
check compares against), at sizes whose three sets fit in the L2 and at one whose sets do not:

    python bench/flush_priority.py [--mib 4,8,64] [--rounds 20]

If `evict_last` over rotated sets reads markedly faster than over fresh buffers while the others
do not, the flush leaves prioritised lines in place and needs to displace them too. Each table
is timed under three flushes: the tuner's (`evict`: a normal-priority read) and, beside it, two
candidate replacements: a read of the same buffer whose own loads are marked evict-last, and
that read followed by a `discard.global.L2` of every line it brought in (an empty L2 after).
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch
    import triton
    import triton.language as tl

    from tuner.backends import triton_device
    from tuner.backends.cuda import CudaBackend

    @triton.jit
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr, POLICY: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, eviction_policy=POLICY)
        tl.store(y_ptr + offs, x * 2, mask=offs < n)

    @triton.jit
    def read_last(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_last")
        tl.atomic_max(out_ptr, tl.max(x, 0))

    @triton.jit
    def discard(x_ptr, out_ptr, lines, BLOCK: tl.constexpr):
        # One `discard.global.L2` per 128-byte line (32 int32): the line leaves the L2 unwritten.
        line = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ptrs = x_ptr + tl.minimum(line, lines - 1).to(tl.int64) * 32
        r = tl.inline_asm_elementwise("discard.global.L2 [$1], 128;\n mov.u32 $0, 0;", "=r,l", [ptrs],
                                      dtype=tl.int32, is_pure=False, pack=1)
        tl.atomic_max(out_ptr, tl.max(r, 0))

    sink = torch.zeros(1, dtype=torch.int32, device="cuda")

    def evict_last_read(buf):
        read_last[(triton.cdiv(buf.numel(), 8192),)](buf, sink, buf.numel(), BLOCK=8192)

    def evict_last_read_discard(buf):
        evict_last_read(buf)
        discard[(triton.cdiv(buf.numel() // 32, 1024),)](buf, sink, buf.numel() // 32, BLOCK=1024)

    flushes = {"tuner's read": triton_device.evict, "evict-last read": evict_last_read,
               "evict-last read, then discard": evict_last_read_discard}

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", default="4,8,64", help="input MiB per buffer set, comma-separated")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    backend = CudaBackend(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name()}, L2 {l2 / 2**20:.0f} MiB; median us (rotated: 3 sets, as the "
          f"tuner times; fresh: a lone call on buffers never seen)\n")
    flush_buf = backend._flush()
    for name, flush in list(flushes.items()):  # its own cost, untimed in a tuning run
        try:
            ts = [backend.time_calls(lambda: flush(flush_buf), 5) for _ in range(6)]
        except Exception as e:  # a flush that does not compile here: left out of the tables
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            del flushes[name]
            continue
        print(f"{name}: {statistics.median(t for r in ts for t in r) * 1e6:.1f} us over "
              f"{flush_buf.numel() * 4 / 2**20:.0f} MiB")
    print()
    print("| flush | input MiB | 3 sets fit the L2 | policy | rotated | fresh | rotated / fresh |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (flush_name, flush), mib in ((f, float(m)) for f in flushes.items() for m in args.mib.split(",")):
        triton_device.evict = flush
        n = int(mib * 2**20) // 2
        grid = (triton.cdiv(n, 4096),)
        for policy in ("", "evict_first", "evict_last"):
            sets = [(torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda",
                     dtype=torch.bfloat16)) for _ in range(3)]
            turn = [0]

            def call():
                x, y = sets[turn[0] % 3]
                turn[0] += 1
                double[grid](x, y, n, BLOCK=4096, POLICY=policy)
            for _ in range(6):
                call()
            rotated = [t for _ in range(args.rounds) for t in backend.time_calls(call, 12)]
            fresh = []
            for _ in range(args.rounds):
                x, y = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda",
                                                                                      dtype=torch.bfloat16)
                fresh.append(backend.time_call(lambda: double[grid](x, y, n, BLOCK=4096, POLICY=policy)))
            r, f = statistics.median(rotated) * 1e6, statistics.median(fresh) * 1e6
            print(f"| {flush_name} | {mib:g} | {'yes' if 3 * 2 * mib * 2**20 <= l2 else 'no'} | {policy or 'none'} | "
                  f"{r:.1f} | {f:.1f} | {r / f:.2f} |")


if __name__ == "__main__":
    main()
