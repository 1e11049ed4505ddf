"""Warm starts: configs to try first, and timings for the guided search's prior, from earlier
measurements of the same space elsewhere (another shape, device or run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tuner.core.landscape import Landscape, LandscapeError, load_cached, read_json, shapes
from tuner.core.space import Space
from tuner.core.values import Config, Status

WARM_START_K = 1


def _warm_sources(sources: Iterable[str]) -> list[list[Config] | Landscape]:
    """Each warm-start source read: a landscape per shape, or a JSON list of configs (ranked)."""
    out: list[list[Config] | Landscape] = []
    for src in sources:
        path, _, shape = str(src).partition("@")
        p = Path(path)
        if p.is_file() and p.suffix == ".json" and isinstance(read_json(p), list):
            configs = read_json(p)
            bad = next((c for c in configs if not isinstance(c, dict)), None)
            if bad is not None or not configs:
                raise LandscapeError(f"{p}: a warm-start list holds configs, each a JSON object of "
                                     f"param -> value, e.g. [{{\"TILE\": 256}}]; found "
                                     f"{repr(bad) if configs else 'an empty list'}")
            out.append([Config.of(c) for c in configs])
            continue
        out.extend(load_cached(p, sh or None) for sh in ([shape] if shape else shapes(p)))
    return out


def warm_starts(sources: Iterable[str], space: Space, k: int = WARM_START_K) -> tuple[Config, ...]:
    """Ranked configs to try first, from earlier measurements of the same space elsewhere (another
    shape, device or run): the `k` fastest of each source that are points of `space` (params
    the space has gained since, taken from its default), interleaved by rank (every source's
    best first), duplicates dropped. A source is a run
    directory, a landscape JSON (`FILE@SHAPE` picks a shape; plain FILE takes all its shapes),
    or a JSON list of configs already ranked, every one of which is tried (a list written by
    hand is what its writer asked for, not a measurement to pick the best of)."""
    sources = _warm_sources(sources)
    ranked = [src if isinstance(src, list) else src.ranked() for src in sources]
    out: list[Config] = []
    for rank in range(max([k, *(len(src) for src in sources if isinstance(src, list))])):
        for src, configs in zip(sources, ranked):
            if rank >= k and not isinstance(src, list):
                continue
            fits = [f for f in (space.complete(c) for c in configs) if f is not None]
            if rank < len(fits) and fits[rank] not in out:
                out.append(fits[rank])
    return tuple(out)


def any_passed(sources: Iterable[str]) -> bool:
    """Whether any of the sources holds a config that passed (a JSON list of configs does)."""
    return any(bool(src) if isinstance(src, list) else bool(src.ranked(1)) for src in _warm_sources(sources))


def warm_timings(sources: Iterable[str], space: Space) -> tuple[dict[Config, float | None], ...]:
    """What each warm-start source measured, for the guided searcher's prior (`GuidedSearch`'s
    `prior`): config (a point of `space`) -> seconds, None where it failed. Configs a source's
    formulas rejected (never run) are left out; a JSON list of configs has no timings and
    gives nothing."""
    out = []
    for src in _warm_sources(sources):
        if isinstance(src, list):
            continue
        timed: dict[Config, float | None] = {}
        for key, o in src.outcomes.items():
            if o.status is Status.INVALID:
                continue
            c = space.complete(Config.of(json.loads(key)))
            if c is not None:
                timed[c] = o.seconds if o.status is Status.OK else None
        if timed:
            out.append(timed)
    return tuple(out)
