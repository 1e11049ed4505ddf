"""What a search that knows nothing of the shape could reach on a landscape JSON, at best.

The cold targets of the search-efficiency work ask for few evaluations to within 3 % of the
optimum on each shape of a landscape file. This measures the best that a whole family of
shape-blind searches reaches there, each one chosen *with hindsight* on the file itself:
a first-improvement local search from the space's default (each param's middle value, as
bench/search_efficiency.py starts), trying one-param moves of one step in a fixed order (a
permutation of the (param, up/down) moves, the same at every shape) and, when none improves,
two-param moves in the order their single moves have; it moves to the first config faster
than the current one. A failed config counts as an evaluation and is never moved to. Each
order is one deterministic search per shape: the table gives, over `--orders` random orders,
the best figure at each shape alone, the best order for all shapes together (the largest
ratio of a shape's figure to its `--target`), and how many orders meet every target.

    python bench/fixed_order_bound.py [--landscape matmul_h200.json] [--orders 30000] \\
        [--target 15,5,4]

A search that adapts its next move to the timings (the default searcher) is not of this
family, so this bounds nothing about it; it shows how much the targets ask of the first
few moves at each shape, and that meeting them by a fixed preference (bigger tiles first,
say) would be fitting the file.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tuner.core import landscape as landscapes  # noqa: E402
from tuner.core.values import Config, Status  # noqa: E402

DEFAULT = str(Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "landscapes" / "matmul_h200.json")


def search(land: landscapes.Landscape, order: list[tuple[int, int]], cap: int) -> int:
    """Evaluations until a config within 3 % (a start within 3 % is 1); cap + 1 if never."""
    params = land.space.params
    best = land.best_s * 1.03

    def time(idx: tuple[int, ...]) -> float:
        o = land.lookup(Config.of({p.name: p.values[i] for p, i in zip(params, idx)}))
        return o.seconds if o is not None and o.status is Status.OK else math.inf

    cur = tuple((len(p.values) - 1) // 2 for p in params)
    seen, n, t_cur = {cur}, 1, time(cur)
    if t_cur <= best:
        return 1
    singles = [[m] for m in order]
    pairs = [[a, b] for a, b in itertools.combinations(order, 2) if a[0] != b[0]]
    while n < cap:
        for moves in singles + pairs:
            idx = list(cur)
            for j, d in moves:
                idx[j] += d
            if not all(0 <= i < len(p.values) for i, p in zip(idx, params)) or tuple(idx) in seen:
                continue
            seen.add(tuple(idx))
            n += 1
            t = time(tuple(idx))
            if t <= best:
                return n
            if t < t_cur or n >= cap:
                break
        else:
            return cap + 1  # a local optimum of this neighbourhood, not within 3 %
        if t < t_cur:
            cur, t_cur = tuple(idx), t
    return cap + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--landscape", default=DEFAULT)
    ap.add_argument("--orders", type=int, default=30000)
    ap.add_argument("--target", default="15,5,4", help="evaluations to within 3 %%, one per shape in file order")
    ap.add_argument("--cap", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    shapes = landscapes.shapes(args.landscape)
    targets = [int(v) for v in args.target.split(",")]
    if len(targets) != len(shapes):
        raise SystemExit(f"--target needs {len(shapes)} numbers, one per shape: {', '.join(shapes)}")
    lands = [landscapes.load_cached(args.landscape, s) for s in shapes]
    params = lands[0].space.params
    moves = [(j, d) for j, p in enumerate(params) if len(p.values) > 1 for d in (-1, 1)]
    rng = random.Random(args.seed)
    alone = [math.inf] * len(shapes)
    joint, meet = (math.inf, None, None), 0
    for _ in range(args.orders):
        order = moves[:]
        rng.shuffle(order)
        got = [search(land, order, args.cap) for land in lands]
        alone = [min(a, g) for a, g in zip(alone, got)]
        score = max(g / t for g, t in zip(got, targets))
        meet += score <= 1
        if score < joint[0]:
            joint = (score, got, order)
    fmt = lambda v: f"> {args.cap}" if v > args.cap else str(v)  # noqa: E731
    print(f"{args.landscape}: {args.orders} move orders, first-improvement local search from the middle config\n")
    print("| shape | target | best order for this shape alone | best order for all shapes |")
    print("| --- | --- | --- | --- |")
    for s, t, a, g in zip(shapes, targets, alone, joint[1]):
        print(f"| {s} | {t} | {fmt(a)} | {fmt(g)} |")
    print(f"\norders meeting every target: {meet} of {args.orders}")
    print("best order for all shapes: " + ", ".join(f"{params[j].name}{'+' if d > 0 else '-'}" for j, d in joint[2]))


if __name__ == "__main__":
    main()
