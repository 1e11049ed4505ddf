"""What a routed call costs inside a torch.compile'd function, on a GPU.

A custom op registered the way `tuner::routed` is (`torch.library.Library`, one kernel for
every dispatch key), whose Python body allocates its output and launches a one-line Triton
kernel on 16x4096 fp32, beside: the body alone; a chain of four (op, `+ 1`) eager and
compiled (default mode); the same chain with torch's own op (which the compiler fuses); and
the chain with the Triton kernel called from the compiled function itself (Dynamo traces a
user-defined Triton kernel). Host time per call, 2000 calls, one synchronisation at the end.

    python bench/compiled_routed_call.py
"""
import time

import torch
import triton
import triton.language as tl

@triton.jit
def twice(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

def body(x):
    y = torch.empty_like(x)
    twice[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y

lib = torch.library.Library("probe", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", body, "CompositeExplicitAutograd")
torch.library.register_fake("probe::twice", lambda x: x.new_empty(x.shape), lib=lib)
op = torch.ops.probe.twice.default

def f(x):
    y = x + 1
    for _ in range(4):
        y = op(y) + 1
    return y
def g(x):
    y = x + 1
    for _ in range(4):
        y = (y * 2) + 1
    return y
def h(x):  # the Triton kernel called straight from the traced function (a user-defined kernel)
    y = x + 1
    for _ in range(4):
        z = torch.empty_like(y)
        twice[(triton.cdiv(y.numel(), 1024),)](y, z, y.numel(), BLOCK=1024)
        y = z + 1
    return y
x = torch.randn(16, 4096, device="cuda")
def t(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6
with torch.no_grad():
    cf, cg, ch = torch.compile(f), torch.compile(g), torch.compile(h)
    cf(x); cg(x); ch(x)
    r = {"op alone": t(lambda: op(x)), "body alone": t(lambda: body(x)),
         "eager f (4 ops)": t(lambda: f(x)), "compiled f": t(lambda: cf(x)),
         "eager g (torch)": t(lambda: g(x)), "compiled g": t(lambda: cg(x)),
         "compiled h (user Triton kernel traced)": t(lambda: ch(x))}
    for k, v in r.items():
        print(f"{k}: {v:.1f} us")
