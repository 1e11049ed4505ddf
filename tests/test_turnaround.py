"""What a model's reply waits for: the reference timed once per device and op (cached with a
key that changes with anything that changes it), the proposer's checks and the rounds' searches
on one set of warm workers, and each round's phases recorded from the reply on."""

import json
import os
import time
from pathlib import Path

from tests.conftest import FIXTURES
from tests.llm_server import ScriptedServer
from tests.test_proposer_loop import env, only_run, space, template  # noqa: F401 - env is a fixture
from tuner.cli.main import main
from tuner.core.problem import spec_from_problem_file
from tuner.core.settings import Settings
from tuner.core.skeleton import Skeleton
from tuner.core.space import Param, Space
from tuner.exec import evaluate
from tuner.exec.evaluate import Evaluator


def _evaluator(tmp_path, spec, settings, name="a"):
    sk = Skeleton("", Space((Param("unset", (0,)),)), "script", name="none")
    return Evaluator("null", spec, sk, settings, tmp_path / name)


def test_the_reference_is_timed_once_and_again_when_what_it_depends_on_changes(tmp_path, monkeypatch):
    problem = tmp_path / "scale.py"
    problem.write_text((FIXTURES / "kernelbench/scale.py").read_text())
    settings = Settings.from_env(cache_dir=str(tmp_path / "cache"), bench_budget_s=0.003, max_reps=10)
    timed = []
    real = Evaluator._time_reference
    monkeypatch.setattr(Evaluator, "_time_reference", lambda self: timed.append(1) or real(self))

    def reference(spec, s=settings, name="a"):
        ev = _evaluator(tmp_path, spec, s, name)
        try:
            ev.start()
            return ev.reference_cached
        finally:
            ev.close()
    spec = spec_from_problem_file(problem)
    assert reference(spec) == "" and len(timed) == 1
    assert reference(spec, name="b") != "" and len(timed) == 1  # another run: from the cache
    assert reference(spec, s=settings.replace(bench_budget_s=0.004)) == "" and len(timed) == 2
    problem.write_text(problem.read_text() + "\n# an edit\n")  # the same path, another problem
    assert reference(spec_from_problem_file(problem)) == "" and len(timed) == 3
    for f in (tmp_path / "cache/reference").iterdir():  # stale or corrupt: timed again
        old = time.time() - evaluate.REFERENCE_TTL_S - 60
        os.utime(f, (old, old))
    assert reference(spec_from_problem_file(problem)) == "" and len(timed) == 4
    for f in (tmp_path / "cache/reference").iterdir():
        f.write_text('{"samples": [0, -1]}')
    assert reference(spec_from_problem_file(problem)) == "" and len(timed) == 5


def test_rounds_share_warm_workers_and_record_their_phases(env, monkeypatch):  # noqa: F811
    from tuner.exec import runner
    started = []

    class Counted(runner.Worker):
        def __init__(self, *a, **k):
            started.append(1)
            super().__init__(*a, **k)
    monkeypatch.setattr(runner, "Worker", Counted)
    steps = [{"reply": space() + template()}, {"reply": space("[16, 256]") + template(center=128)}]
    runs = env / "runs"
    with ScriptedServer(steps) as srv:
        rc = main(["tune", "softmax", "--shape", "256x64", "--backend", "null", "--llm", "coder",
                   "--llm-base-url", srv.base_url, "--rounds", "2", "--budget", "6",
                   "--validate-configs", "2", "--seed", "1", "--runs-dir", str(runs), "--quiet"])
    assert rc == 0
    run = only_run(runs)
    order = ["checked", "compiled", "first_timed", "validated", "search_first_timed", "done"]
    for r in ("01", "02"):
        phases = json.loads((run / f"rounds/{r}/proposal.json").read_text())["phases"]
        assert list(phases) == order, phases
        assert all(0 <= phases[a] <= phases[b] for a, b in zip(order, order[1:])), phases
    summary = json.loads((run / "summary.json").read_text())
    assert [list(x["phases"]) for x in summary["rounds"]] == [order, order]
    # The rounds' winners were re-timed side by side; the faster there is the winner.
    side = {x["round"]: x["best_side_by_side_s"] for x in summary["rounds"]}
    assert summary["winner_round"] == min(side, key=side.get)
    assert summary["best"]["median_s"] == side[summary["winner_round"]]
    assert "side by side" in summary["best"]["timing"] and summary["reference"]["interleaved"]
    # One set of workers for the checks and both searches, and the reference timed once (by
    # the checks; the rounds' searches found it cached).
    assert len(started) == Settings.from_env().n_compile_workers + 1
    for r in ("01", "02"):
        assert json.loads((run / f"rounds/{r}/summary.json").read_text())["reference"]["cached_from"]
