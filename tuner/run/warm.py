"""Warm starts: configs to try first, and timings for the guided search's prior, from earlier
measurements of the same space elsewhere (another shape, device or run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tuner.core.landscape import Landscape, LandscapeError, load_cached, read_json, shapes
from tuner.core.space import Space
from tuner.core.values import Config, OpSpec, Status

WARM_START_K = 1
EARLIER_RUNS = 3  # the most recent runs of the same command a new one starts from (`earlier_runs`)


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


def earlier_runs(runs_dir: str | Path, spec: OpSpec, backend: str, options: dict | None, skeleton_hash: str,
                 device_name: str) -> list[str]:
    """The run directories directly under `runs_dir` that searched the same thing a new run is
    about to: the same op (name, sizes, dtype, problem file and its text), backend and backend options, the
    same skeleton (its hash: template and space) on a device of the same name, each with a
    config that passed; the `EARLIER_RUNS` most recent, oldest first. A new run of the same
    command warm-starts from them (`tuner tune`, unless `--fresh` or `--warm-start`): it tries
    their best configs first and, when guided, takes their timings as its prior, so that the
    same command run twice names the better of the two answers instead of a second draw of
    the noise (its final re-timing puts the earlier winners against its own in one
    interleave). Multi-round runs, their rounds and retunes are left out (each has a search of
    its own kind)."""
    from tuner.run.store import Store, list_runs

    def same_problem(path: Path) -> bool:  # a problem file edited since that run is another op
        try:
            return (path / Store.PROBLEM_COPY).read_bytes() == Path(spec.source).read_bytes()
        except OSError:
            return False
    found = []
    for path, meta, _summary in list_runs(runs_dir) if Path(runs_dir).is_dir() else []:
        if (meta.op.to_json() != spec.to_json() or meta.backend != backend
                or (meta.backend_options or {}) != (options or {})
                or not meta.skeleton or meta.skeleton.get("hash") != skeleton_hash
                or meta.device is None or meta.device.name != device_name
                or meta.is_rounds or meta.round is not None or meta.retune_of
                or (spec.kind == "kernelbench" and not same_problem(path))):
            continue
        found.append((meta.created, path.name, str(path)))
    taken: list[str] = []
    for _, _, p in sorted(found, reverse=True):  # newest first: only as many records read as needed
        try:
            if any_passed([p]):
                taken.append(p)
        except (LandscapeError, OSError):  # records that do not read: not a source to start from
            pass
        if len(taken) == EARLIER_RUNS:
            break
    return taken[::-1]
