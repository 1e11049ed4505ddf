"""The conformance suite every search strategy passes (as Optuna runs one suite over its
samplers): through the real search loop (`tune.run_search`) and `prepare_searcher`, on a small
recorded landscape whose constraints reject part of the space. A new strategy adds its name
to `SAMPLERS` and passes this unchanged.

The contract: a strategy never has a config evaluated twice; a config the space's formulas
reject is never evaluated (it is recorded INVALID, never compiled); a search resumed from its
records evaluates nothing again and ends with the same number of evaluations; the same seed
gives the same search."""

import pytest

from tuner.core import landscape as landscapes
from tuner.core.space import parse_space
from tuner.core.values import Status
from tuner.offline.replay import MemoryStore, ReplayEvaluator
from tuner.run.tune import run_search
from tuner.search.searcher import SAMPLERS, prepare_searcher

BUDGET = 14


def _landscape() -> landscapes.Landscape:
    """72 configs, of which the formulas reject those with TILE * WARPS > 256 (a resource
    limit) and those with SPLIT and TILE < 32; one config fails to compile."""
    space = parse_space("language: script\nsizes: [N]\nparams:\n  TILE: {pow2: [4, 128]}\n"
                        "  WARPS: [1, 2, 4, 8]\n  SPLIT: [false, true, 'auto']\n"
                        "constraints:\n  - not SPLIT or TILE >= 32\n"
                        "resources:\n  smem: TILE * WARPS\n"
                        "default: {TILE: 16, WARPS: 2, SPLIT: false}\n")
    ctx, out = {"N": 4096}, {}
    for c in space.configs():
        d = c.as_dict()
        if d == {"TILE": 64, "WARPS": 4, "SPLIT": "auto"}:
            out[c.key] = landscapes.Outcome(Status.COMPILE_ERROR, detail="error: too many registers")
            continue
        t = 1.0 + 0.1 * abs(d["TILE"].bit_length() - 6) + 0.05 * abs(d["WARPS"] - 4) + (0.2 if d["SPLIT"] else 0)
        out[c.key] = landscapes.Outcome(Status.OK, t * 1e-5)
    return landscapes.Landscape(space, out, name="strategies", shape="N=4096", context=ctx,
                                limits={"smem": 256.0})


def _search(sampler: str, seed: int, budget: int, store=None, seeds=()):
    land = _landscape()
    ev = ReplayEvaluator(land)
    store = store if store is not None else MemoryStore()
    searcher = prepare_searcher(land.space, sampler, seed, ev.check, ev.context, ev.limits, seeds)
    run_search(store, ev, searcher, budget, None, 1)
    return store, ev


def _evaluated(store):
    return [r for r in store.records() if r.status is not Status.INVALID]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_strategy_never_has_a_config_evaluated_twice(sampler):
    store, _ = _search(sampler, 0, BUDGET)
    keys = [r.config.key for r in _evaluated(store)]
    assert len(keys) == BUDGET and len(set(keys)) == len(keys)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_config_the_formulas_reject_is_never_evaluated(sampler):
    store, ev = _search(sampler, 1, BUDGET)
    for r in store.records():
        rejected = ev.check(r.config) is not None
        assert rejected == (r.status is Status.INVALID), (r.config, r.status)
        if rejected:
            assert not r.build.artifact  # recorded, never compiled
    assert store.records()[0].config == _landscape().space.default_config()  # the default goes first


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_resumed_search_evaluates_nothing_again(sampler):
    store, _ = _search(sampler, 2, BUDGET // 2)
    first = {r.config.key for r in _evaluated(store)}
    store, _ = _search(sampler, 2, BUDGET, store=store)  # a new searcher over the same records
    evaluated = _evaluated(store)
    keys = [r.config.key for r in evaluated]
    assert len(keys) == BUDGET and len(set(keys)) == BUDGET and first <= set(keys)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_same_seed_gives_the_same_search(sampler):
    a = [r.config for r in _search(sampler, 3, BUDGET)[0].records()]
    b = [r.config for r in _search(sampler, 3, BUDGET)[0].records()]
    assert a == b


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_configs_given_first_are_evaluated_first(sampler):
    land = _landscape()
    first = [c for c in land.space.configs() if ReplayEvaluator(land).check(c) is None][-2:]
    store, _ = _search(sampler, 4, BUDGET, seeds=first)
    order = [r.config for r in _evaluated(store)]
    assert order[1:3] == first  # after the default
