"""Replay: recorded landscapes answered through the whole pipeline (CLI, workers, verification).

A landscape JSON and a `--sampler grid` run directory both become a replay skeleton
(`python -m tuner.offline.replay skeleton`), which `tuner tune --backend replay` searches like any
other: the replayed records carry the recorded statuses, failure messages and times.
"""

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tuner.backends import get_backend
from tuner.cli.main import main
from tuner.core import landscape as landscapes
from tuner.core.ops import builtin_spec
from tuner.core.values import Config, Status
from tuner.offline import replay
from tuner.run import warm as warmstart
from tuner.run.store import Store

SPEC = builtin_spec("matmul", "2048x8192x1024")  # the op the replayed compiles are for

LAND = FIXTURES / "landscapes"
MATMUL = LAND / "matmul_h200.json"


def fast_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_MAX_REPS", "20")
    monkeypatch.setenv("TUNER_COMPILE_WORKERS", "1")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_landscape_json_reads_as_recorded(tmp_path):
    assert landscapes.shapes(MATMUL) == ["4096x4096x4096", "16x14336x4096", "2048x8192x1024"]
    land = landscapes.load(MATMUL, "4096x4096x4096")
    assert land.space.size == 960 and len(land.outcomes) == 960
    assert sum(o.status is Status.OK for o in land.outcomes.values()) == 848
    assert land.best_s == pytest.approx(0.1855e-3, rel=1e-3)
    assert len(land.within(0.03)) == 4 and len(land.within(0.10)) == 17
    fail = next(o for o in land.outcomes.values() if o.status is not Status.OK)
    assert fail.status is Status.RUNTIME_ERROR and "shared memory" in fail.detail
    with pytest.raises(landscapes.LandscapeError, match="pick one of"):
        landscapes.load(MATMUL)
    with pytest.raises(landscapes.LandscapeError, match="no shape"):
        landscapes.load(MATMUL, "1x2x3")

    for text in ("[1, 2]", '{"space": [1]}'):  # JSON, but not a landscape: said so, not an AttributeError
        (tmp_path / "not.json").write_text(text)
        with pytest.raises(landscapes.LandscapeError, match="a landscape JSON has 'space'"):
            landscapes.load(tmp_path / "not.json", "")


def test_replay_backend_answers_from_the_landscape(tmp_path):
    b = get_backend("replay")
    land = landscapes.load(MATMUL, "2048x8192x1024")
    best = land.ranked(1)[0]
    overflow = next(Config.of(json.loads(k)) for k, o in land.outcomes.items() if o.status is not Status.OK)

    def script(config):
        return f"landscape: {MATMUL}\nshape: 2048x8192x1024\nconfig: {json.dumps(config.as_dict())}\n"

    build = b.compile(script(best), SPEC, str(tmp_path / "a"), 10)
    assert build.status is Status.OK and build.binary_hash
    kernel = b.load(build.artifact, _op())
    assert kernel.seconds == pytest.approx(land.best_s)
    build = b.compile(script(overflow), SPEC, str(tmp_path / "b"), 10)
    kernel = b.load(build.artifact, _op())
    with pytest.raises(RuntimeError, match="shared memory"):
        kernel([])
    missing = b.compile(script(Config.of({**best.as_dict(), "GM": 4})), SPEC, str(tmp_path / "c"), 10)
    assert missing.status is Status.COMPILE_ERROR and "no record" in missing.error
    assert b.compile("garbage", SPEC, str(tmp_path / "d"), 10).status is Status.COMPILE_ERROR


def _op():
    from tuner.core.ops import builtin_spec, load_op
    return load_op(builtin_spec("matmul", "8x8x8"))


def test_tune_through_the_cli_on_a_replayed_landscape(tmp_path, monkeypatch):
    """A real `tuner tune --backend replay` run: records carry the landscape's statuses and times."""
    fast_env(monkeypatch, tmp_path)
    shape = "4096x4096x4096"
    assert replay.main(["skeleton", str(MATMUL), "--shape", shape, "--out", str(tmp_path / "sk")]) == 0
    runs = tmp_path / "runs"
    rc = main(["tune", "matmul", "--shape", "16x16x16", "--backend", "replay",
               "--template", str(tmp_path / "sk" / "replay.txt.j2"), "--space", str(tmp_path / "sk" / "replay.yaml"),
               "--budget", "14", "--seed", "2", "--parallel", "1", "--runs-dir", str(runs), "--quiet",
               "--warm-start", f"{MATMUL}@2048x8192x1024"])
    assert rc == 0
    run = only_run(runs)
    land = landscapes.load(MATMUL, shape)
    records = Store.open(run).records()
    assert len(records) == 14
    # The default first, then the warm starts in rank order.
    warm = warmstart.warm_starts([f"{MATMUL}@2048x8192x1024"], land.space)
    assert [r.config for r in records[:1 + len(warm)]] == [land.space.default_config(), *warm]
    for r in records:
        o = land.lookup(r.config)
        assert r.status is o.status, (r.config, r.reason)
        if o.status is Status.OK:
            assert r.seconds == pytest.approx(o.seconds)
        else:
            assert "shared memory" in r.reason
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["median_s"] == pytest.approx(min(r.seconds for r in records))
    assert summary["best"]["median_s"] <= land.best_s * 1.10
    meta = json.loads((run / "run.json").read_text())
    assert meta["sampler"] == "guided" and meta["warm_start"] == [f"{MATMUL}@2048x8192x1024"]


def test_warm_start_timings_reach_the_search_and_a_lost_source_does_not_stop_a_resume(tmp_path, monkeypatch, capsys,
                                                                                      priors_given):
    """A run warm-started from another run directory: the source's timings become the guided
    searcher's prior (`warmstart.warm_timings`); deleted before a resume, the source is skipped
    with a note and the run finishes its budget. A source that does not read fails the new run
    before it has a directory."""
    import shutil
    fast_env(monkeypatch, tmp_path)
    assert replay.main(["skeleton", str(MATMUL), "--shape", "4096x4096x4096", "--out", str(tmp_path / "sk")]) == 0
    common = ["--shape", "16x16x16", "--backend", "replay", "--template", str(tmp_path / "sk" / "replay.txt.j2"),
              "--space", str(tmp_path / "sk" / "replay.yaml"), "--parallel", "1"]
    assert main(["tune", "matmul", *common, "--budget", "8", "--runs-dir", str(tmp_path / "a"), "--quiet"]) == 0
    source = only_run(tmp_path / "a")
    land = landscapes.load(source)
    (prior,) = warmstart.warm_timings([str(source)], land.space)
    measured = {r.config: r for r in Store.open(source).records()}
    assert set(prior) == {c for c, r in measured.items() if r.status is not Status.INVALID}
    assert all((t is None) == (measured[c].status is not Status.OK) for c, t in prior.items())

    priors_given.clear()
    assert main(["tune", "matmul", *common, "--budget", "10", "--runs-dir", str(tmp_path / "b"), "--quiet",
                 "--warm-start", str(source)]) == 0
    assert priors_given and priors_given[0] == (prior,)  # the guided searcher got the source's timings
    run = only_run(tmp_path / "b")
    shutil.rmtree(source)
    capsys.readouterr()
    assert main(["tune", "--resume", str(run), "--budget", "14"]) == 0
    said = capsys.readouterr()
    assert f"not warm-starting from {source}" in said.out + said.err
    assert len(Store.open(run).records()) == 14
    assert main(["tune", "matmul", *common, "--budget", "4", "--runs-dir", str(tmp_path / "c"), "--quiet",
                 "--warm-start", str(source)]) == 2
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_a_warm_start_from_another_ops_run_is_named_as_unused(tmp_path, monkeypatch, capsys):
    fast_env(monkeypatch, tmp_path)
    assert replay.main(["skeleton", str(MATMUL), "--shape", "4096x4096x4096", "--out", str(tmp_path / "sk")]) == 0
    other = FIXTURES.parents[1] / "bench" / "landscapes" / "rope-4096x32x128-bf16-h200"
    capsys.readouterr()
    assert main(["tune", "matmul", "--shape", "16x16x16", "--backend", "replay",
                 "--template", str(tmp_path / "sk" / "replay.txt.j2"), "--space", str(tmp_path / "sk" / "replay.yaml"),
                 "--parallel", "1", "--budget", "3", "--runs-dir", str(tmp_path / "runs"),
                 "--warm-start", str(other)]) == 0
    said = capsys.readouterr()
    assert f"not warm-starting from {other}: none of the configs it passed" in said.out + said.err


def test_a_grid_run_replays_as_recorded(tmp_path, monkeypatch):
    """Record a full landscape with --sampler grid on a real backend, then replay it."""
    fast_env(monkeypatch, tmp_path)
    grid_runs = tmp_path / "grid"
    common = ["tune", "softmax", "--shape", "64x128", "--quiet", "--parallel", "1"]
    assert main([*common, "--backend", "null", "--template", str(LAND / "tiny.txt.j2"),
                 "--space", str(LAND / "tiny.yaml"), "--sampler", "grid", "--budget", "100",
                 "--runs-dir", str(grid_runs)]) == 0
    grid = only_run(grid_runs)
    recorded = {r.config.key: r for r in Store.open(grid).records()}
    assert len(recorded) == 36  # the whole space, BM=128 > M recorded as INVALID
    land = landscapes.load(grid)
    assert {k: o.status for k, o in land.outcomes.items()} == {k: r.status for k, r in recorded.items()}
    statuses = {o.status for o in land.outcomes.values()}
    assert {Status.OK, Status.INVALID, Status.COMPILE_ERROR, Status.WRONG_RESULT} <= statuses
    assert land.ranked(1)[0] == Config.of({"BM": 32, "BN": 32, "W": 2})

    # In process: the search finds the recorded best; the space's constraint still filters.
    trace = replay.replay_search(land, "guided", 0, budget=30, stop_within=0.0)
    assert trace.evaluations_to(0.0) <= 27

    # Through the pipeline: same op and shape, the run's own space and a replay template.
    assert replay.main(["skeleton", str(grid), "--out", str(tmp_path / "sk")]) == 0
    runs = tmp_path / "runs"
    assert main([*common, "--backend", "replay", "--template", str(tmp_path / "sk" / "replay.txt.j2"),
                 "--space", str(tmp_path / "sk" / "replay.yaml"), "--budget", "12", "--seed", "1",
                 "--runs-dir", str(runs)]) == 0
    replayed = Store.open(only_run(runs)).records()
    assert len([r for r in replayed if r.status is not Status.INVALID]) == 12
    for r in replayed:
        g = recorded[r.config.key]
        assert r.status is g.status, (r.config, r.reason, g.reason)
        if g.status is Status.OK:
            assert r.seconds == pytest.approx(g.seconds)


def test_a_run_directory_with_gzipped_records_reads_the_same(tmp_path):
    """Landscapes kept for good (bench/landscapes) store their records gzipped."""
    import gzip
    import shutil
    packed = Path(__file__).resolve().parents[1] / "bench" / "landscapes" / "attention-4x32x4096x128-bf16-h200"
    plain = tmp_path / "plain"
    shutil.copytree(packed, plain)
    with gzip.open(plain / "records.jsonl.gz", "rt") as f:
        (plain / "records.jsonl").write_text(f.read())
    (plain / "records.jsonl.gz").unlink()
    a, b = landscapes.load(plain), landscapes.load(packed)
    assert a.outcomes == b.outcomes and a.space.to_json() == b.space.to_json() and a.context == b.context
    assert landscapes.load_cached(packed).best_s == a.best_s
    broken = tmp_path / "broken"
    shutil.copytree(packed, broken)
    raw = (broken / "records.jsonl.gz").read_bytes()
    (broken / "records.jsonl.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(landscapes.LandscapeError, match="records.jsonl.gz"):
        landscapes.load(broken)


def _ok(config: dict, samples: tuple, binary: str):
    from tuner.core.values import Build, Measurement, Record
    return Record("k", "s", Config.of(config), Build(Status.OK, binary_hash=binary), Measurement(Status.OK, samples), "d")


def test_finalists_are_the_fastest_three_and_every_other_within_the_noise():
    """The winner is named from an interleave of the finalists: the three fastest kernels (one
    per binary), every other within 5 % of the best or within the medians' own standard
    errors, at most eight."""
    from tuner.run.winner import finalists
    recs = [_ok({"i": i}, (1.0 + 0.01 * i,) * 5, f"b{i}") for i in range(12)]  # 1 %, 2 % ... slower
    recs.append(_ok({"i": 99}, (1.0,) * 5, "b0"))  # the same binary as the best: not timed twice
    assert [r.config.as_dict()["i"] for r in finalists(recs)] == [0, 1, 2, 3, 4, 5]  # within 5 %
    close = [_ok({"i": i}, (1.0 + 0.005 * i,) * 5, f"b{i}") for i in range(12)]  # 0.5 % apart
    assert [r.config.as_dict()["i"] for r in finalists(close)] == list(range(8))  # at most 8
    assert [r.config.as_dict()["i"] for r in finalists(recs, 3, 8, 0.0)] == [0, 1, 2]
    far = [_ok({"i": 0}, (1.0,) * 5, "a"), _ok({"i": 1}, (1.5,) * 5, "b"), _ok({"i": 2}, (2.0,) * 5, "c"),
           _ok({"i": 3}, (2.01,) * 5, "d")]
    assert [r.config.as_dict()["i"] for r in finalists(far)] == [0, 1, 2]  # the three, nothing else near
    # A noisy best (8 samples, IQR 0.37 of its median: the median's standard error ~12 %):
    # configs up to ~25 % slower are in.
    noisy = [_ok({"i": 0}, (0.6, 0.8, 0.85, 1.0, 1.0, 1.15, 1.2, 1.4), "a")] + \
        [_ok({"i": i}, (1.0 + 0.04 * i,) * 8, f"b{i}") for i in range(1, 9)]
    assert [r.config.as_dict()["i"] for r in finalists(noisy)] == [0, 1, 2, 3, 4, 5, 6]


def test_finalists_are_ranked_by_the_figure_the_search_ranked_them_by():
    """A config timed against the incumbent in one interleave is ranked by that figure (drift
    between evaluations taken out), not by its own median taken under other clocks: here its
    own median read 10 % slow, its interleave with the incumbent 5 % fast."""
    import dataclasses

    from tuner.run.winner import finalists
    incumbent = _ok({"i": 0}, (1.0,) * 5, "a")
    drifted = dataclasses.replace(_ok({"i": 1}, (1.1,) * 5, "b"), anchored_s=0.95)
    others = [_ok({"i": i}, (1.02 + 0.01 * i,) * 5, f"c{i}") for i in range(2, 5)]
    assert [r.config.as_dict()["i"] for r in finalists([incumbent, drifted] + others, 1, 1, 0.0)] == [1]
    assert [r.config.as_dict()["i"] for r in finalists([incumbent, drifted] + others, 3, 3, 0.0)] == [1, 0, 2]


def test_a_search_figure_that_flatters_a_kernel_buys_it_a_place_in_the_final_interleave_not_the_win():
    """The finalists are chosen by the search's figure, which a kernel that runs fast only
    beside the incumbent could flatter; the winner is still the fastest of the one final
    interleave (re-timed by the harness), re-checked; one whose re-timed calls are wrong is
    recorded as such and out."""
    import dataclasses

    from tuner.core.settings import Settings
    from tuner.offline.replay import MemoryStore
    from tuner.run.winner import pick_winner
    honest = _ok({"i": 0}, (1.0,) * 5, "a")
    flatterer = dataclasses.replace(_ok({"i": 1}, (1.2,) * 5, "b"), anchored_s=0.5)
    liar = dataclasses.replace(_ok({"i": 2}, (1.1,) * 5, "c"), anchored_s=0.6)
    truly = {0: 1.0, 1: 1.3, 2: 0.4}  # what the final interleave measures

    class Harness:
        reference_samples, reference_s, reference_retimed, retimed_top, memcheck_result = [], None, False, [], ""

        def retime(self, records, with_reference=False):
            got = [[truly[r.config.as_dict()["i"]]] * 5 if r.config.as_dict()["i"] != 2
                   else "wrong result in a timed call" for r in records]
            return got + ([[2.0] * 5] if with_reference else [])

        def recheck(self, record):
            return None

        def memcheck(self, record):
            return "clean"

    store = MemoryStore()
    for r in (honest, flatterer, liar):
        store.append(r)
    winner = pick_winner(store, Harness(), Settings(retime_top=3, retime_max=3))
    assert winner is not None and winner.config.as_dict()["i"] == 0
    out = [r for r in store.records() if r.config.as_dict()["i"] == 2 and r.status is not Status.OK]
    assert out and "wrong" in out[-1].measurement.detail


def test_a_noisy_replay_is_seeded_and_names_its_winner_from_an_interleave():
    """Timings drawn around the recorded ones (a drift per evaluation, jitter and stalls per
    call); the same seed gives the same search; the named winner's true time is reported."""
    land = replay.synthetic("smooth", 0)
    noise = replay.Noise(drift=0.05, jitter=0.02)
    a = replay.replay_search(land, "random", 3, budget=30, noise=noise)
    b = replay.replay_search(land, "random", 3, budget=30, noise=noise)
    assert a.times == b.times and a.named == b.named and a.named is not None
    assert a.retimed >= 3 and a.named_s == land.lookup(a.named).seconds
    assert a.named in a.configs and a.named_within(1.0) and not a.named_within(a.named_s / a.best_s - 1 - 1e-9)
    ev = replay.ReplayEvaluator(land, noise=noise, seed=1)
    rec = ev.evaluate(a.named)
    assert len(rec.measurement.samples) == noise.calls and rec.seconds != a.named_s
    quiet = replay.replay_search(land, "random", 3, budget=30)
    assert quiet.named_s == min(quiet.times)  # without noise: the search's best, as recorded
    with pytest.raises(ValueError, match="DRIFT"):
        replay.Noise.parse("lots")


def test_a_new_best_is_timed_against_the_incumbent_before_the_search_walks_on():
    """Under drift between evaluations, a config timed faster than the incumbent is timed
    again with it in one interleave; the search is told the incumbent's figure times their
    ratio (`Record.anchored_s`), the raw samples stay. Without noise the ratio is exact, so the
    search is the same; and the record round-trips through JSON."""
    from tuner.core.values import Record
    from tuner.run.tune import run_search
    from tuner.search.searcher import prepare_searcher
    land = replay.synthetic("smooth", 1)
    noise = replay.Noise(drift=0.05, jitter=0.01)
    ev = replay.ReplayEvaluator(land, noise=noise, seed=2)
    searcher = prepare_searcher(land.space, "guided", 2, ev.check, ev.context, ev.limits, ())
    store = replay.MemoryStore()
    progress = run_search(store, ev, searcher, 30, None, 1, anchor_margin=0.0)
    anchored = [r for r in store.records() if r.anchored_s is not None]
    assert anchored and progress.anchored == len(anchored) == ev.retimes
    for r in anchored:
        assert r.search_s == r.anchored_s != r.seconds and len(r.measurement.samples) == noise.calls
        assert Record.from_json(json.loads(json.dumps(r.to_json()))) == r
    told = {t.number: t.value for t in searcher.study.trials}
    r = anchored[-1]
    import math
    assert told[r.trial] == pytest.approx(math.log10(r.anchored_s))
    plain = replay.replay_search(land, "guided", 2, budget=30)
    exact = replay.replay_search(land, "guided", 2, budget=30, anchor_margin=0.0)
    assert exact.times == plain.times and exact.anchored > 0


def test_the_anchor_margin_follows_the_drift_the_anchors_measured():
    """`winner.drift_margin`: 6 % before anything is measured; after a search on a quiet device
    (drift 0.3 %) its anchors pull it down, on a noisy one (8 %) up towards the 10 % bound (the
    anchored configs are those whose drift kept them near the incumbent, so the spread they
    measure runs low: the median over seeds is held, not each seed); a few anchors move it
    less than many (pooled with the assumed 3 % drift)."""
    from tuner.run.tune import run_search
    from tuner.run.winner import ANCHOR_DRIFT, DRIFT_MARGIN, drift_margin
    from tuner.search.searcher import prepare_searcher
    assert drift_margin([]) == pytest.approx(0.06)
    land = replay.synthetic("smooth", 1)
    margins, fewer = {0.003: [], 0.08: []}, {0.003: [], 0.08: []}
    for seed in range(5):
        for drift in margins:
            ev = replay.ReplayEvaluator(land, noise=replay.Noise(drift=drift, jitter=0.002), seed=seed)
            searcher = prepare_searcher(land.space, "guided", seed, ev.check, ev.context, ev.limits, ())
            store = replay.MemoryStore()
            run_search(store, ev, searcher, 40, None, 1, anchor_margin=ANCHOR_DRIFT)
            records = store.records()
            assert sum(r.anchored_s is not None for r in records) >= 8
            margins[drift].append(drift_margin(records))
            few = [r for r in records if r.anchored_s is not None][:2] + [r for r in records if r.anchored_s is None]
            fewer[drift].append(abs(drift_margin(few) - 0.06))
    import statistics
    for drift in margins:
        assert statistics.median(fewer[drift]) < statistics.median(abs(m - 0.06) for m in margins[drift])
    assert max(margins[0.003]) < 0.05 and statistics.median(margins[0.08]) > 0.085
    assert max(margins[0.08]) == DRIFT_MARGIN[1]


def test_a_config_whose_calls_go_wrong_when_timed_against_the_incumbent_is_recorded_wrong():
    """A kernel right when first timed and wrong in the interleave with the incumbent (it told
    one timing from the other) is a WRONG_RESULT record, not a new best told to the search."""
    from tuner.run.tune import run_search
    from tuner.search.searcher import prepare_searcher
    land = replay.synthetic("smooth", 1)

    class TwoFaced(replay.ReplayEvaluator):
        def retime(self, records, with_reference=False):
            return ["a timed call's result was wrong"] + super().retime(records[1:])
    ev = TwoFaced(land)
    searcher = prepare_searcher(land.space, "guided", 2, ev.check, ev.context, ev.limits, ())
    store = replay.MemoryStore()
    run_search(store, ev, searcher, 12, None, 1, anchor_margin=0.0)
    wrong = [r for r in store.records() if r.status is Status.WRONG_RESULT]
    assert wrong and all("re-timed against the incumbent" in r.reason for r in wrong)
    assert all(r.anchored_s is None for r in store.records())
    ok = [r for r in store.records() if r.status is Status.OK]
    assert ok and min(r.seconds for r in ok) >= min(r.seconds for r in ok[:1])  # the first stays the best


def test_evaluations_in_flight_replay_in_simulated_time():
    """`SimulatedFlight`: each evaluation compiles for its own compile_s, then the device times
    one at a time in the order the compiles finished, `timing_s` each; a failed build ends with
    its compile; `wait` moves the clock to the earliest end and returns what has ended. A
    replay with evaluations in flight is then the same search for a seed, run after run and
    under another hash seed (threads and the wall clock had made it differ)."""
    import subprocess
    import sys
    from types import SimpleNamespace as NS

    from tuner.core.values import Status
    flight = replay.SimulatedFlight(timing_s=1.0)
    rec = lambda compile_s, status=Status.OK: NS(build=NS(compile_s=compile_s, status=status))  # noqa: E731
    a = flight.submit(lambda: rec(2.0))
    b = flight.submit(lambda: rec(0.5))
    c = flight.submit(lambda: rec(1.0, Status.COMPILE_ERROR))
    assert a.result().build.compile_s == 2.0  # the answer is there at once; its end is simulated
    assert flight.wait({a, b, c}) == {c} and flight.now() == 1.0  # c failed compiling; b is being timed
    assert flight.wait({a, b}) == {b} and flight.now() == 1.5  # b compiled first, so timed first
    d = flight.submit(lambda: rec(0.1))  # compiled at 1.6, before a (2.0)
    assert flight.wait({a, d}) == {d} and flight.now() == 2.6
    assert flight.wait({a}) == {a} and flight.now() == 3.6
    # A recorded landscape: its compile times set the pace, and so how many are in flight.
    code = ("from tuner.core.landscape import load_cached\nfrom tuner.offline import replay\n"
            "t = replay.replay_search(load_cached('bench/landscapes/layernorm-8192x8192-bf16-h200', None), "
            "'guided', 1, budget=30, parallel=15, noise=replay.Noise(), anchor_margin='drift')\n"
            "print([round(x, 9) for x in t.times], t.named_s, t.anchored)")
    root = Path(__file__).resolve().parents[1]
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                           env={**__import__("os").environ, "PYTHONHASHSEED": str(h)}) for h in (1, 2, 3)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout and runs[0].stdout.count(",") >= 29
