"""What rendering a config costs: `Skeleton.render` (the template compiled once per text, run
under the render deadline) against compiling the template again on every render, as renders
did before, for library skeletons.

    python bench/render_time.py [--configs 200]
"""

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.core import skeleton as sk  # noqa: E402
from tuner.core.ops import builtin_spec, load_op, render_context  # noqa: E402

CASES = [("matmul", "1024x1024x1024", "triton", "fp16"), ("attention", "2x4x256x64", "triton", "fp16"),
         ("softmax", "64x1024", "c", "fp32"), ("matmul", "512x512x512", "c", "fp32")]


def per_render(fn, configs) -> float:
    t0 = time.perf_counter()
    for c in configs:
        fn(c)
    return (time.perf_counter() - t0) / len(configs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=200)
    args = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
    print("| skeleton | configs | render (compiled once) | compiled on every render |")
    print("| --- | --- | --- | --- |")
    for op, shape, lang, dtype in CASES:
        skel = sk.library_skeleton(op, lang)
        ctx = {**render_context(load_op(builtin_spec(op, shape, dtype))), "CORES": 132, "ARCH": 90, "ctype": "float"}
        configs = list(skel.space.configs())[:args.configs]  # rendered whether or not the formulas accept them
        now = per_render(lambda c: skel.render(c, ctx), configs)
        before = per_render(lambda c: sk._environment().from_string(skel.template).render(**ctx, **c.as_dict()),
                            configs)
        print(f"| {op}/{lang} {shape} | {len(configs)} | {now * 1e3:.3f} ms | {before * 1e3:.3f} ms |")


if __name__ == "__main__":
    main()
