"""What replaying served launches as CUDA graphs does to a patched model's forward, three rules side by side.

    python bench/serve_graphs.py MODEL_FILE --db export/tuning.json [--dtype bf16] [--rounds 60] [--queued 30]

The model file (a `tuner profile` / `tuner verify` model file) runs plain and patched with the
exported table three times over, each patched copy with a table of its own (kernels and graphs
not shared): its served launches made directly (no graphs), replayed as graphs captured on every
second sighting of a buffer set (`LaunchGraphs.FREE` unbounded: the rule before captures had to
pay back), and as served by default (`tuner.serve.graphs.LaunchGraphs`). Printed: each
variant's median forward against eager, timed in turns (`tuner.model.verify.interleaved`),
first with the same inputs every forward and then with a new set each (`timing_sets`); the
same in turns of `--block` forwards each, every forward timed alone, the first of each turn
left out (as a user's loop runs one model: other models' allocations between two forwards
could move the buffers its graphs were captured on); the time per forward of `--queued` forwards back to back
(the host's time per forward is then what the device waits for); and per served kernel and
section, the graphs captured and replayed. On a machine without a GPU the three rules are the
same (graphs serve GPU launches only).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from patch_profile import model_arguments, prepared  # noqa: E402

from tuner.model.verify import cycling, interleaved, timing_sets  # noqa: E402
from tuner.serve.patch import patched_copy  # noqa: E402
from tuner.serve.runtime import Table  # noqa: E402

RULES = ("launched directly", "graphs on every call", "graphs as served")


def set_rule(patched, rule: str) -> None:
    """Every served kernel of `patched` launched by `rule` (after a forward made its graphs)."""
    for _key, _op, _ins, kernel, _n in patched.tuner_patch.served():
        if rule == "launched directly":
            kernel._graphs = False
        elif rule == "graphs on every call" and kernel._graphs:
            kernel._graphs.FREE = 10 ** 9


def blocked(fns: dict, sync, rounds: int, block: int) -> dict[str, float]:
    """The median seconds per forward of each function, `block` forwards a turn in rotation,
    each timed alone between synchronisations; the first of each turn not counted."""
    import statistics

    from tuner.exec.measure import round_order
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names[i] for i in round_order(len(names), r)):
            for i in range(block):
                sync()
                t0 = time.perf_counter()
                fns[name]()
                sync()
                if i:
                    samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def graph_books(patched: dict) -> dict:
    return {(rule, key): (k._graphs.captured, k._graphs.replays) if k._graphs else (0, 0)
            for rule, p in patched.items() for key, _o, _i, k, _n in p.tuner_patch.served()}


def graph_delta(patched: dict, before: dict) -> str:
    now = graph_books(patched)
    per_rule: dict[str, list[int]] = {}
    for (rule, key), (c, r) in now.items():
        c0, r0 = before.get((rule, key), (0, 0))
        t = per_rule.setdefault(rule, [0, 0])
        t[0] += c - c0
        t[1] += r - r0
    return "; ".join(f"{rule} {c} / {r}" for rule, (c, r) in per_rule.items())


def main() -> None:
    import torch
    ap = model_arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--queued", type=int, default=30, help="forwards back to back per variant")
    ap.add_argument("--block", type=int, default=4, help="forwards per variant's turn in the blocked timing")
    a = ap.parse_args()
    if a.block < 2:
        ap.error("--block: at least 2 (the first forward of each turn is not counted)")
    device, sync, model, xs = prepared(a.model, a.dtype)
    print(f"{a.model} on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, {a.dtype}")
    with torch.no_grad():
        patched = {rule: patched_copy(model, Table.load(a.db)) for rule in RULES}
        for rule, p in patched.items():
            p(*xs)  # makes each served kernel's graphs
            set_rule(p, rule)
        for label, sets in (("the same inputs", [xs]), ("a new set of inputs each forward", timing_sets(xs, a.rounds + 1))):
            fns = {"eager": cycling(model, sets), **{rule: cycling(p, sets) for rule, p in patched.items()}}
            books = graph_books(patched)
            med = interleaved(fns, sync, a.rounds)
            print(f"\n{label}, forwards timed one by one in turns ({a.rounds} rounds):")
            for name, s in med.items():
                print(f"  {name:22s} {s * 1e6:9.1f} us  {med['eager'] / s:.3f}x eager")
            print("  graphs captured / replayed meanwhile: " + graph_delta(patched, books))
            books = graph_books(patched)
            med = blocked(fns, sync, a.rounds // a.block + 1, a.block)
            print(f"{label}, in turns of {a.block} forwards each, each timed alone, the first of a turn left out:")
            for name, s in med.items():
                print(f"  {name:22s} {s * 1e6:9.1f} us  {med['eager'] / s:.3f}x eager")
            print("  graphs captured / replayed meanwhile: " + graph_delta(patched, books))
            print(f"{label}, {a.queued} forwards back to back:")
            for name, f in fns.items():
                sync()
                t0 = time.perf_counter()
                for _ in range(a.queued):
                    f()
                sync()
                print(f"  {name:22s} {(time.perf_counter() - t0) / a.queued * 1e6:9.1f} us per forward")
        print("\ngraphs per served kernel (captured / replayed):")
        for rule, p in patched.items():
            for key, _op, _ins, kernel, _n in p.tuner_patch.served():
                g = kernel._graphs
                print(f"  {rule:22s} {key}: " + (f"{g.captured} / {g.replays}" if g else "none"))


if __name__ == "__main__":
    main()
