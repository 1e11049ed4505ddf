"""Every library triton_ascend skeleton through the sim backend's whole harness (Evaluator:
compile workers, checks, the declared costs metered, timing), a few configs each: the default,
one per value of each structural param and a few at random (tests/test_triton_library's
`sample_configs`), at most 12. Prints per op the configs evaluated, how many passed, the wall
time and every failure with its reason.

    python bench/sim_library.py            # small fp32 shapes: kernels interpreted whole
    python bench/sim_library.py --large    # 4096-wide bf16 shapes: a sample of programs metered
    python bench/sim_library.py --large --audit   # and the winner's audit (memcheck) of one config per op
"""

import argparse
import sys
import tempfile
import time
from multiprocessing.pool import ThreadPool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_triton_library import sample_configs  # noqa: E402
from tuner.core.ops import builtin_spec  # noqa: E402
from tuner.core.settings import Settings  # noqa: E402
from tuner.core.skeleton import library_skeleton, library_skeletons  # noqa: E402
from tuner.core.values import Status  # noqa: E402
from tuner.exec.evaluate import Evaluator  # noqa: E402

SMALL = {"softmax": "37x1000", "rmsnorm": "33x777", "layernorm": "33x777", "add_rmsnorm": "33x512",
         "swiglu": "33x700", "rope": "17x3x64", "matmul": "65x96x80", "cross_entropy": "17x1000"}
LARGE = {"softmax": "4096x4096", "rmsnorm": "4096x4096", "layernorm": "4096x4096", "add_rmsnorm": "4096x4096",
         "swiglu": "4096x4096", "rope": "4096x32x128", "matmul": "1024x1024x1024", "cross_entropy": "1024x32000"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--large", action="store_true")
    p.add_argument("--audit", action="store_true", help="also time the audit (memcheck) of the first OK config")
    args = p.parse_args()
    shapes, dtype = (LARGE, "bf16") if args.large else (SMALL, "fp32")
    out = Path(tempfile.mkdtemp(prefix="sim_library_"))
    st = Settings.from_env(runs_dir=str(out / "runs"), cache_dir=str(out / "cache"), compile_workers=2,
                           min_reps=3, max_reps=5, bench_budget_s=0.01)
    for op, langs in sorted(library_skeletons().items()):
        if "triton_ascend" not in langs or op not in shapes:
            continue
        ev = Evaluator("sim", builtin_spec(op, shapes[op], dtype), library_skeleton(op, "triton_ascend"), st, out / op)
        t = time.time()
        try:
            ev.start()
            configs = sample_configs(ev.skeleton, ev.context, ev.limits, extra=3)[0][:12]
            with ThreadPool(2) as pool:
                recs = pool.map(ev.evaluate, configs)
            wall = time.time() - t
            audit = ""
            ok = [r for r in recs if r.status is Status.OK]
            if args.audit and ok:
                t = time.time()
                said = ev.memcheck(ok[0])
                audit = f"; audit of {ok[0].config}: {time.time() - t:.1f} s, {said}"
        finally:
            ev.close()
        print(f"{op} {shapes[op]} {dtype}: {len(ok)} of {len(recs)} OK, {wall:.0f} s{audit}", flush=True)
        for r in recs:
            if r.status is not Status.OK:
                print(f"    {r.config}: {r.status.value}: {r.reason[:300]}", flush=True)


if __name__ == "__main__":
    main()
