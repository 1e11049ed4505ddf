"""End to end through the CLI on the null backend (and the cpu backend where it is cheap)."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from tuner.cli import NO_WINNER
from tuner.cli.main import main
from tuner.core.values import Status
from tuner.run.store import Store

NULL = ["--backend", "null", "--template", str(FIXTURES / "null/landscape.txt.j2"),
        "--space", str(FIXTURES / "null/landscape.yaml")]


def fast_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_MAX_REPS", "20")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_null_run_end_to_end(tmp_path, monkeypatch, capsys):
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    rc = main(["tune", "softmax", "--shape", "256x512", *NULL, "--budget", "40", "--seed", "3",
               "--runs-dir", str(runs), "--quiet"])
    assert rc == 0
    run = only_run(runs)
    records = Store.open(run).records()
    keys = [r.config.key for r in records]
    assert len(keys) == len(set(keys)), "a config was evaluated twice"
    evaluated = [r for r in records if r.status is not Status.INVALID]
    assert len(evaluated) == 40
    # The scripted faults happen and become records; the run still completes.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["config"] and summary["best"]["median_s"] > 0
    assert summary["evaluations"] == 40
    for status, f in summary["failures"].items():
        assert f["count"] == sum(1 for r in records if r.status.value == status)
    assert (run / "best" / "kernel.txt").is_file() and (run / "best" / "config.json").is_file()
    meta = json.loads((run / "run.json").read_text())
    assert meta["op"]["name"] == "softmax" and meta["device"]["name"] and meta["command"]
    out = capsys.readouterr().out
    assert "best config" in out and "% of ceiling" in out

    assert main(["show", str(run)]) == 0
    assert "best config" in capsys.readouterr().out
    assert main(["list", "--runs-dir", str(runs)]) == 0
    assert run.name in capsys.readouterr().out
    # An unfinished run (no summary yet) lists its best so far and its evaluations, as `show`.
    from tuner.run.report import runs_table
    from tuner.run.store import list_runs
    (run / "summary.json").rename(run / "summary.kept")
    table = runs_table(list_runs(runs))
    cells = {c.header: list(c._cells) for c in table.columns}
    assert cells["best"][0].endswith("so far") and cells["evals"] == ["40"], cells
    assert cells["state"][0].startswith("incomplete")
    (run / "summary.kept").rename(run / "summary.json")
    assert main(["export", str(run), "--out", str(tmp_path / "exp")]) == 0
    exported = sorted(p.name for p in (tmp_path / "exp").iterdir())
    assert exported == ["softmax_best.json", "softmax_best.txt"]
    assert json.loads((tmp_path / "exp" / "softmax_best.json").read_text())["config"] == summary["best"]["config"]


def test_anchoring_goes_through_the_real_workers_and_survives_a_resume(tmp_path, monkeypatch):
    """TUNER_ANCHOR=on (default only on cuda and npu): a config timed faster than the incumbent
    is re-timed with it through the evaluator's interleave; the figure told is on the record
    (`anchored_s`) and counted in the summary; a resume reads it back; a bad value is refused."""
    from tuner.core.settings import Settings
    fast_env(monkeypatch, tmp_path)
    monkeypatch.setenv("TUNER_ANCHOR", "on")
    runs = tmp_path / "runs"
    assert main(["tune", "softmax", "--shape", "256x512", *NULL, "--budget", "12", "--seed", "1",
                 "--runs-dir", str(runs), "--quiet"]) == 0
    run = only_run(runs)
    anchored = [r for r in Store.open(run).records() if r.anchored_s is not None]
    assert anchored and all(r.status is Status.OK and r.anchored_s > 0 for r in anchored)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["anchored"] == len(anchored) == summary["drift"]["anchors"]
    assert 0.01 <= summary["drift"]["margin"] <= 0.10
    assert (summary["drift"]["measured"] is None) == (len(anchored) < 2)
    from rich.console import Console

    from tuner.run.report import summary_table
    c = Console(width=300, record=True, file=io.StringIO())
    c.print(summary_table(summary))
    shown = c.export_text()
    assert f"from {len(anchored)} config" in shown and "re-timed against the best so far" in shown, shown
    before = [(r.config.key, r.anchored_s) for r in Store.open(run).records()]
    assert main(["tune", "--resume", str(run), "--budget", "16", "--quiet"]) == 0
    after = [(r.config.key, r.anchored_s) for r in Store.open(run).records()]
    assert after[:len(before)] == before and len(after) > len(before)  # read back as written
    assert Settings().anchors("cuda") and not Settings().anchors("cpu") and Settings(anchor="on").anchors("cpu")
    with pytest.raises(ValueError, match="one of auto, on, off"):
        Settings(anchor="yes").anchors("cuda")


def test_every_sampler_runs(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    for sampler in ("random", "cmaes", "grid"):
        runs = tmp_path / sampler
        assert main(["tune", "softmax", "--shape", "256x512", *NULL, "--budget", "8", "--seed", "1",
                     "--sampler", sampler, "--runs-dir", str(runs), "--quiet"]) == 0
        assert json.loads((only_run(runs) / "summary.json").read_text())["evaluations"] == 8


def test_time_budget_stops_the_search(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    assert main(["tune", "softmax", "--shape", "256x512", *NULL, "--budget", "100000",
                 "--time-budget", "3", "--runs-dir", str(runs), "--quiet"]) == 0
    assert time.monotonic() - t0 < 60
    assert 0 < json.loads((only_run(runs) / "summary.json").read_text())["evaluations"] < 480


def test_small_space_is_exhausted_not_looped(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    assert main(["tune", "softmax", "--shape", "64x128", "--backend", "null",
                 "--template", str(FIXTURES / "null/mixed.txt.j2"), "--space", str(FIXTURES / "null/mixed.yaml"),
                 "--budget", "100", "--runs-dir", str(runs), "--quiet"]) == 0
    records = Store.open(only_run(runs)).records()
    assert len(records) == 8  # the whole space, each config once
    assert sum(r.status is Status.RUNTIME_ERROR for r in records) == 4


def test_resume_after_sigkill(tmp_path):
    """SIGKILL a real `tuner tune` mid-search, resume it: nothing lost, nothing evaluated twice."""
    runs = tmp_path / "runs"
    env = {**os.environ, "TUNER_BENCH_BUDGET_S": "0.02", "TUNER_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tuner", "tune", "softmax", "--shape", "256x512", *NULL,
           "--budget", "60", "--seed", "7", "--runs-dir", str(runs), "--quiet", "--parallel", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    run = None
    while time.monotonic() < deadline:
        dirs = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
        if dirs and (dirs[0] / "records.jsonl").exists():
            run = dirs[0]
            if len((run / "records.jsonl").read_text().splitlines()) >= 12:
                break
        if proc.poll() is not None:
            pytest.fail(f"tuner exited before it could be killed: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    assert run is not None, "no run directory appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = Store(run).records()
    assert not (run / "summary.json").exists()

    resumed = subprocess.run([sys.executable, "-m", "tuner", "tune", "--resume", str(run), "--budget", "60",
                              "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = Store(run).records()
    assert [r.to_json() for r in after[:len(before)]] == [r.to_json() for r in before], "a record was lost"
    keys = [r.config.key for r in after if r.status is not Status.INVALID]
    assert len(keys) == len(set(keys)), "a config was evaluated twice"
    assert len(keys) == 60
    assert json.loads((run / "summary.json").read_text())["evaluations"] == 60


def test_ctrl_c_records_the_evaluations_in_flight(tmp_path):
    """Ctrl-C during a search: leaving waits for the evaluations in flight in any case (here two
    hung kernels, killed at the run timeout); their records are kept, so a resume does not
    evaluate them again."""
    (tmp_path / "hang.yaml").write_text("language: script\nsizes: [M, N]\nparams:\n  A: {range: [1, 40]}\n")
    (tmp_path / "hang.txt.j2").write_text("time: {{ 1e-4 * A }}\nfault: hang\n")
    runs = tmp_path / "runs"
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tuner", "tune", "softmax", "--shape", "64x64", "--backend", "null",
           "--template", str(tmp_path / "hang.txt.j2"), "--space", str(tmp_path / "hang.yaml"),
           "--budget", "10", "--parallel", "2", "--run-timeout", "3", "--runs-dir", str(runs), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (runs.exists() and any(runs.glob("*/build/*/kernel.txt"))):  # an evaluation has begun
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.05)
    time.sleep(0.5)
    run = next(runs.iterdir())
    assert Store(run).records() == []  # nothing has finished: the kernels hang for 3 s
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and f"tuner tune --resume {run}" in err
    kept = [r for r in Store(run).records() if r.status is not Status.INVALID]
    assert kept and all(r.status is Status.RUN_TIMEOUT for r in kept)


def test_kernelbench_problem_file_on_null(tmp_path, monkeypatch, capsys):
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    rc = main(["tune", "--op", str(FIXTURES / "kernelbench/relu.py"), "--size", "batch_size=4",
               "--size", "dim=256", "--backend", "null",
               "--template", str(FIXTURES / "kernelbench/relu_null.txt.j2"),
               "--space", str(FIXTURES / "kernelbench/relu_null.yaml"), "--runs-dir", str(runs), "--quiet"])
    assert rc == 0
    summary = json.loads((only_run(runs) / "summary.json").read_text())
    assert summary["op"]["sizes"] == {"batch_size": 4, "dim": 256}
    assert summary["best"]["config"] == {"V": 1}


def test_an_edited_problem_file_is_another_op_for_the_earlier_runs(tmp_path, monkeypatch, capsys):
    """The same problem file path run again starts from the earlier run; once its text changed,
    that run searched another op and is no source."""
    fast_env(monkeypatch, tmp_path)
    problem = tmp_path / "relu.py"
    problem.write_text((FIXTURES / "kernelbench/relu.py").read_text())
    argv = ["tune", "--op", str(problem), "--size", "batch_size=4", "--size", "dim=256", "--backend", "null",
            "--template", str(FIXTURES / "kernelbench/relu_null.txt.j2"),
            "--space", str(FIXTURES / "kernelbench/relu_null.yaml"), "--runs-dir", str(tmp_path / "runs"),
            "--budget", "2", "--quiet"]
    assert main(argv) == 0 and "warm start" not in capsys.readouterr().err
    assert main(argv) == 0 and "1 earlier run(s)" in capsys.readouterr().err
    problem.write_text(problem.read_text() + "\n# edited\n")
    assert main(argv) == 0 and "warm start" not in capsys.readouterr().err


def test_resume_refuses_a_problem_file_that_now_ends_the_process_at_import(tmp_path, monkeypatch, capsys):
    import shutil
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    problem = tmp_path / "relu.py"
    shutil.copy(FIXTURES / "kernelbench/relu.py", problem)
    rc = main(["tune", "--op", str(problem), "--size", "batch_size=4", "--size", "dim=256",
               "--backend", "null", "--budget", "2",
               "--template", str(FIXTURES / "kernelbench/relu_null.txt.j2"),
               "--space", str(FIXTURES / "kernelbench/relu_null.yaml"), "--runs-dir", str(runs), "--quiet"])
    assert rc == 0
    problem.write_text("import os\nos._exit(0)\n")  # edited since: it would end the tool here
    capsys.readouterr()
    rc = main(["tune", "--resume", str(only_run(runs)), "--budget", "4", "--quiet"])
    assert rc == 2 and "ended the process" in capsys.readouterr().err


def test_kernelbench_problem_file_on_cpu(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    rc = main(["tune", "--op", str(FIXTURES / "kernelbench/relu.py"), "--size", "dim=1024",
               "--backend", "cpu", "--template", str(FIXTURES / "kernelbench/relu.c.j2"),
               "--space", str(FIXTURES / "kernelbench/relu.yaml"), "--budget", "4", "--runs-dir", str(runs),
               "--quiet"])
    assert rc == 0
    summary = json.loads((only_run(runs) / "summary.json").read_text())
    assert summary["best"] is not None and summary["evaluations"] == 4


def test_a_default_invalid_at_this_shape_starts_the_search_next_to_it(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    # BM <= M: the default BM=32 is invalid at M=16; the nearest valid config is BM=16, rest kept.
    assert main(["tune", "softmax", "--shape", "16x512", *NULL, "--budget", "3", "--seed", "1",
                 "--runs-dir", str(runs), "--quiet"]) == 0
    by_trial = {r.trial: r for r in Store.open(only_run(runs)).records()}  # records land as they finish
    assert by_trial[0].status is Status.INVALID and by_trial[0].config.as_dict()["BM"] == 32
    assert by_trial[1].config.as_dict() == {"BM": 16, "BN": 32, "WARPS": 2, "STAGES": 1}
    assert by_trial[1].status is not Status.INVALID


def test_the_spaces_promising_configs_are_tried_right_after_the_default(tmp_path, monkeypatch):
    """The skeleton author's (or the model's) guesses cost an evaluation each, in their order,
    before the search proper; one the constraints reject at this shape is tried as the nearest
    config they accept."""
    fast_env(monkeypatch, tmp_path)
    space = tmp_path / "s.yaml"
    space.write_text((FIXTURES / "null/landscape.yaml").read_text()
                     + "promising:\n  - {BM: 16, BN: 128, WARPS: 8}\n  - {BM: 256, BN: 64}\n")
    runs = tmp_path / "runs"
    assert main(["tune", "softmax", "--shape", "64x512", "--backend", "null", "--template",
                 str(FIXTURES / "null/landscape.txt.j2"), "--space", str(space), "--budget", "5",
                 "--parallel", "1", "--runs-dir", str(runs), "--quiet"]) == 0
    by_trial = {r.trial: r.config.as_dict() for r in Store.open(only_run(runs)).records()}
    assert by_trial[0] == {"BM": 32, "BN": 32, "WARPS": 2, "STAGES": 1}
    assert by_trial[1] == {"BM": 16, "BN": 128, "WARPS": 8, "STAGES": 1}
    assert by_trial[2] == {"BM": 64, "BN": 64, "WARPS": 2, "STAGES": 1}  # BM <= M at M = 64
    assert len(by_trial) == 5


def test_the_same_command_again_starts_from_the_earlier_runs(tmp_path, monkeypatch, capsys):
    """A new run of the same op, shape, dtype, skeleton and device tries the earlier runs' best
    configs first (right after the default) and says so; --fresh, another shape, another
    skeleton or another device's run does not; at most the three most recent are taken."""
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    argv = ["tune", "softmax", "--shape", "64x512", *NULL, "--budget", "4", "--parallel", "1",
            "--runs-dir", str(runs), "--quiet"]

    def tune(*more) -> Path:
        before = {p for p in runs.iterdir()} if runs.is_dir() else set()
        assert main([*argv, *more]) == 0
        (new,) = {p for p in runs.iterdir() if p.is_dir()} - before
        return new

    def warm(run: Path) -> list[str]:
        return [Path(p).name for p in json.loads((run / "run.json").read_text()).get("warm_start", [])]

    first = tune("--seed", "1")
    assert warm(first) == [] and "warm start" not in capsys.readouterr().err
    best = json.loads((first / "summary.json").read_text())["best"]["config"]
    second = tune("--seed", "2")
    assert warm(second) == [first.name]
    assert "earlier run(s) of this op, skeleton and device" in capsys.readouterr().err
    by_trial = {r.trial: r.config.as_dict() for r in Store.open(second).records()}
    assert best in (by_trial[0], by_trial[1])  # the default, then the earlier best
    third = tune("--seed", "3", "--fresh")
    assert warm(third) == []
    other_shape = main(["tune", "softmax", "--shape", "128x512", *argv[4:], "--seed", "4"])
    assert other_shape == 0 and "warm start" not in capsys.readouterr().err
    space = tmp_path / "s.yaml"  # another skeleton: the same params, one more constraint
    space.write_text((FIXTURES / "null/landscape.yaml").read_text().replace("  - BM <= M", "  - BM <= M\n  - BN <= N"))
    assert main([*argv[:8], "--space", str(space), *argv[10:], "--seed", "5"]) == 0
    assert "warm start" not in capsys.readouterr().err
    # Another device's run is no source (its run.json names another device).
    meta = json.loads((first / "run.json").read_text())
    meta["device"]["name"] = "another device"
    (first / "run.json").write_text(json.dumps(meta))
    sixth = tune("--seed", "6")
    assert warm(sixth) == [second.name, third.name]
    # The three most recent runs of this command, oldest first (a --fresh run is one of them).
    assert warm(tune("--seed", "7")) == [second.name, third.name, sixth.name]


def test_a_run_resumes_from_another_directory_and_without_its_build_folder(tmp_path, monkeypatch):
    """Records keep where each kernel was compiled, relative to the directory the command ran
    in (`runs/<id>/build/...`): a resume from elsewhere found none of them when it re-timed
    the top configs, and failed there ("cannot open shared object file"); so did a resume of
    a run whose build/ had been deleted."""
    fast_env(monkeypatch, tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert main(["tune", "softmax", "--shape", "16x64", "--backend", "cpu", "--budget", "3",
                 "--runs-dir", "runs", "--quiet"]) == 0
    run = only_run(tmp_path / "a" / "runs")
    assert not Path(Store.open(run).records()[0].build.artifact).is_absolute()
    monkeypatch.chdir(tmp_path / "b")
    assert main(["tune", "--resume", str(run), "--budget", "5", "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evaluations"] == 5 and summary["best"] is not None
    # build/ deleted to save space: the configs the re-timing needs are compiled again.
    import shutil
    shutil.rmtree(run / "build")
    assert main(["tune", "--resume", str(run), "--budget", "6", "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text())["evaluations"] == 6


def test_a_space_whose_constraints_leave_almost_nothing_still_gets_searched(tmp_path, monkeypatch):
    fast_env(monkeypatch, tmp_path)
    names = "ABCDEFGHIJKL"
    space = tmp_path / "s.yaml"
    space.write_text("language: script\nparams:\n" + "".join(f"  {n}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" for n in names)
                     + f"constraints:\n  - {' + '.join(names)} < 20\n")  # valid: 5e-8 of 1e12 configs
    tpl = tmp_path / "t.txt.j2"
    tpl.write_text("time: {{ 1e-4 * (1 + A + 2 * B) }}\n")
    runs = tmp_path / "runs"
    assert main(["tune", "softmax", "--shape", "16x64", "--backend", "null", "--template", str(tpl),
                 "--space", str(space), "--budget", "6", "--seed", "2", "--runs-dir", str(runs), "--quiet"]) == 0
    records = Store.open(only_run(runs)).records()
    ok = [r for r in records if r.status is Status.OK]
    assert len(ok) == 6 and len({r.config.key for r in ok}) == 6


def test_warm_up_starts_every_compile_worker_before_any_compile(fast_settings, tmp_path):
    """The compile workers start while the device and the reference are measured, not after."""
    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import load_skeleton
    from tuner.exec.evaluate import Evaluator
    skeleton = load_skeleton(FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")
    ev = Evaluator("null", builtin_spec("softmax", "64x512", "fp32"), skeleton, fast_settings, tmp_path / "run")
    try:
        workers = list(ev.runner.compilers)
        assert workers and all(w.proc is None for w in workers)
        ev.warm_up()
        ev.start()
        for t in ev.runner._warming:
            t.join(timeout=60)
        assert all(w.proc is not None and w.proc.poll() is None for w in workers)
        assert ev.runner._compilers.qsize() == len(workers)  # every one back, ready for compiles
    finally:
        ev.close()
    assert all(w.proc is None for w in workers)


def _slow_start_evaluator(step: str, delay_s: float, fail: BaseException | None = None):
    """An Evaluator on the null backend whose start step `step` ("device" facts or
    "reference") takes `delay_s` (and then fails with `fail`, when given); it notes when that
    step ended ("<step> done") and when compiles and measurements began."""
    from tuner.exec.evaluate import Evaluator

    class SlowStart(Evaluator):
        events: list = []

        def _slow(self, what):
            time.sleep(delay_s)
            self.events.append((f"{what} done", time.monotonic()))
            if fail is not None:
                raise fail

        def _device_info(self):
            if step == "device":
                self._slow("device")
            return super()._device_info()

        def _time_reference(self):
            if step == "reference":
                self._slow("reference")
            return super()._time_reference()

        def compile(self, source, digest):
            self.events.append(("compile", time.monotonic()))
            return super().compile(source, digest)

        def measure(self, build, best_s=None, what=""):
            self.events.append(("measure", time.monotonic()))
            return super().measure(build, best_s, what)
    return SlowStart


def _when(events, what) -> list[float]:
    return [t for w, t in events if w == what]


def _null_run(tmp_path, monkeypatch):
    """(settings, store) of a fresh null-backend run with two compile workers."""
    from tuner.core.ops import builtin_spec
    from tuner.core.settings import Settings
    from tuner.core.skeleton import load_skeleton
    from tuner.run.tune import create_run
    fast_env(monkeypatch, tmp_path)
    settings = Settings.from_env(runs_dir=str(tmp_path / "runs"), compile_workers=2)
    skeleton = load_skeleton(FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")
    return settings, create_run(settings, builtin_spec("softmax", "64x512", "fp32"), "null", skeleton,
                                sampler="random", seed=1)


@pytest.mark.parametrize("step", ["reference", "device"])
def test_first_compiles_overlap_the_start_and_no_candidate_is_measured_before_it(step, tmp_path, monkeypatch):
    """The first configs compile while the device facts are taken and the reference is timed;
    no candidate is measured before both are in; records still name the device."""
    from tuner.run.tune import execute
    settings, store = _null_run(tmp_path, monkeypatch)
    make = _slow_start_evaluator(step, 2.0)
    summary = execute(store, settings, 6, parallel=2, make_evaluator=make)
    done = _when(make.events, f"{step} done")[0]
    compiles, measures = _when(make.events, "compile"), _when(make.events, "measure")
    assert compiles and min(compiles) < done, f"no compile began during the {step} step"
    assert measures and min(measures) >= done, f"a candidate was measured before the {step} step ended"
    assert summary["reference"]["median_s"] > 0 and summary["evaluations"] == 6
    name = summary["device"]["name"]
    evaluated = [r for r in Store.open(store.path).records() if r.status is not Status.INVALID]
    assert name and evaluated and all(r.device == name for r in evaluated)
    assert json.loads((store.path / "run.json").read_text())["device"]["name"] == name
    tl = summary["timeline"]
    assert tl["device_s"] <= tl["device_and_reference_s"] <= tl["search_done_s"]
    assert tl["device_s" if step == "device" else "device_and_reference_s"] >= 2.0


def test_device_facts_that_fail_in_the_background_fail_the_run(tmp_path, monkeypatch):
    from tuner.exec.worker import WorkerError
    from tuner.run.tune import execute
    settings, store = _null_run(tmp_path, monkeypatch)
    make = _slow_start_evaluator("device", 0.5, WorkerError("no device: the driver is gone"))
    with pytest.raises(WorkerError, match="the driver is gone"):
        execute(store, settings, 6, parallel=2, make_evaluator=make)
    assert not _when(make.events, "measure")


def test_a_reference_that_fails_in_the_background_fails_the_run_before_any_measurement(tmp_path, monkeypatch):
    from tuner.run.tune import execute
    settings, store = _null_run(tmp_path, monkeypatch)
    make = _slow_start_evaluator("reference", 0.5, MemoryError("inputs do not fit; pick a smaller shape"))
    with pytest.raises(MemoryError, match="pick a smaller shape"):
        execute(store, settings, 6, parallel=2, make_evaluator=make)
    assert _when(make.events, "compile"), "nothing compiled beside the reference"
    assert not _when(make.events, "measure")
    # No timing was recorded without a reference to set it against.
    assert all(r.status is not Status.OK for r in Store.open(store.path).records())
    # The device facts came before the failure: the run's metadata kept them.
    assert json.loads((store.path / "run.json").read_text())["device"]["name"]


@contextlib.contextmanager
def _warmed_null_evaluator(fast_settings, tmp_path):
    """A started null Evaluator whose compile workers have all finished warming up."""
    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import load_skeleton
    from tuner.exec.evaluate import Evaluator
    skeleton = load_skeleton(FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")
    ev = Evaluator("null", builtin_spec("softmax", "64x512", "fp32"), skeleton, fast_settings, tmp_path / "run")
    try:
        ev.warm_up()
        ev.start()
        for t in ev.runner._warming:
            t.join(timeout=60)
        yield ev
    finally:
        ev.close()


def test_compile_workers_run_below_the_timing_workers_priority(fast_settings, tmp_path):
    """Compiles that fill every core must not delay the process that times candidates."""
    def nice(proc) -> int:
        return int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    with _warmed_null_evaluator(fast_settings, tmp_path) as ev:
        compilers = [nice(w.proc) for w in ev.runner.compilers]
        timer = nice(ev.runner.bench_workers[0].proc)
    assert compilers and all(n > timer for n in compilers), (compilers, timer)


def test_compile_workers_are_single_threaded_and_share_tritons_cache_key(fast_settings, tmp_path, monkeypatch):
    """Thread pools in every compile process starved the timing process of CPUs. MLIR's
    switch is in Triton's cache key: the timing process gets it too, or it compiles again.
    The timing process keeps the user's OpenMP threads (the cpu backend's kernels use them)."""
    def env(proc) -> dict:
        raw = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        return dict(x.decode().split("=", 1) for x in raw if b"=" in x)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with _warmed_null_evaluator(fast_settings, tmp_path) as ev:
        compilers = [env(w.proc) for w in ev.runner.compilers]
        timer = env(ev.runner.bench_workers[0].proc)
    assert compilers
    for e in compilers:
        assert (e.get("OMP_NUM_THREADS"), e.get("MLIR_DISABLE_MULTITHREADING")) == ("1", "1")
    assert (timer.get("OMP_NUM_THREADS"), timer.get("MLIR_DISABLE_MULTITHREADING")) == ("3", "1")


def test_tuner_profile_writes_the_benchmark_workers_profile(fast_settings, tmp_path, monkeypatch):
    import pstats

    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import load_skeleton
    from tuner.exec.evaluate import Evaluator
    monkeypatch.setenv("TUNER_PROFILE", str(tmp_path / "prof"))
    skeleton = load_skeleton(FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")
    ev = Evaluator("null", builtin_spec("softmax", "64x512", "fp32"), skeleton, fast_settings, tmp_path / "run")
    try:
        ev.start()
        assert ev.evaluate(skeleton.space.default_config()).status is Status.OK
    finally:
        ev.close()
    files = list((tmp_path / "prof").glob("worker-*.prof"))
    assert len(files) == 1  # the benchmark worker's; compile workers are not profiled
    names = {fn for _, _, fn in pstats.Stats(str(files[0])).stats}
    assert "measure" in names


def test_a_skeleton_broken_for_every_config_stops_the_search_and_says_so(tmp_path, monkeypatch, capsys):
    fast_env(monkeypatch, tmp_path)
    broken = tmp_path / "broken.txt.j2"
    broken.write_text((FIXTURES / "null/landscape.txt.j2").read_text() + "\n{{ NO_SUCH_PARAM * 2 }}\n")
    runs = tmp_path / "runs"
    assert main(["tune", "softmax", "--shape", "256x512", "--backend", "null", "--template", str(broken),
                 "--space", str(FIXTURES / "null/landscape.yaml"), "--budget", "40", "--runs-dir", str(runs)]) == NO_WINNER
    summary = json.loads((only_run(runs) / "summary.json").read_text())
    from tuner.run.tune import SAME_FAILURE_STOP
    assert SAME_FAILURE_STOP <= summary["evaluations"] < 40
    assert "NO_SUCH_PARAM" in summary["search_stopped"] and "skeleton is broken" in summary["search_stopped"]
    assert "stopped early" in capsys.readouterr().out


def test_failures_that_depend_on_the_config_never_stop_the_search():
    from tuner.core.values import Build, Config, Measurement, Record
    from tuner.run.tune import _failure_signature

    def rec(status, error="", detail=""):
        return Record("op", "sk", Config.of({"BM": 64}), Build(Status.COMPILE_ERROR if error else Status.OK, error=error),
                      Measurement(status, detail=detail), None, (), 0.0, 0)
    a = rec(Status.COMPILE_ERROR, error="runs/x/build/0a1b2c/kernel.c:1:14: error: expected expression")
    b = rec(Status.COMPILE_ERROR, error="runs/x/build/ffee99/kernel.c:1:14: error: expected expression")
    assert _failure_signature(a) == _failure_signature(b) is not None  # the build folder is the config's
    limit = rec(Status.COMPILE_ERROR, error="out of resource: shared memory, Required: 1, Hardware limit: 0")
    assert _failure_signature(limit) is None
    assert _failure_signature(rec(Status.OK)) is None


def test_compile_workers_get_the_backends_compile_options_and_the_warm_up_the_same(fast_settings, tmp_path, monkeypatch):
    """Evaluator: compile workers get Backend.compile_options on top of the run's options, the
    benchmark worker does not. Ray: the warm-up's compile Worker is the one compiles find."""
    from tuner.backends.null import NullBackend
    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import load_skeleton
    from tuner.exec import ray_worker
    from tuner.exec.evaluate import Evaluator
    from tuner.exec.runner import WorkerPools
    monkeypatch.setattr(NullBackend, "compile_options", lambda self: {"told": 7})
    skeleton = load_skeleton(FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")
    spec = builtin_spec("softmax", "64x512", "fp32")
    ev = Evaluator("null", spec, skeleton, fast_settings, tmp_path / "run")
    pools = WorkerPools(fast_settings, tmp_path / "pools.log")
    try:
        assert all(w.options.get("told") == 7 for w in ev.runner.compilers)
        assert all("told" not in w.options for w in ev.runner.bench_workers)
        compilers, benchers = pools.get(ev.placement)
        assert all(w.options.get("told") == 7 for w in compilers) and "told" not in benchers[0].options
        # Ray: warm up with the executor's options, then compile with the evaluator's.
        ray_worker._COMPILE_WORKERS.clear()
        settings = fast_settings
        ray_worker.warm_in_task("null", ray_worker.warm_options("null", settings), settings, None, {}, False)
        (kind, build), _ = ray_worker.compile_in_task("null", ev.placement.compile_options, settings, None, {},
                                                         "time: 0.001\n", ev.spec.to_json(), str(tmp_path / "b"),
                                                         False)
        assert kind == "ok" and build.status is Status.OK
        assert len(ray_worker._COMPILE_WORKERS) == 1, "the warm-up started a Worker no compile uses"
    finally:
        ev.close()
        pools.close()
        for w in ray_worker._COMPILE_WORKERS.values():
            w.close()
        ray_worker._COMPILE_WORKERS.clear()


def test_a_noisy_winner_timing_is_flagged_in_the_summary(tmp_path, monkeypatch, capsys):
    """A busy machine: the winner's re-timing spread wider than half its median. The
    table says so (it used to print the times as if they were sound). And a winner slower than
    torch's own."""
    from rich.console import Console

    from tuner.run.report import summary_table
    fast_env(monkeypatch, tmp_path)
    runs = tmp_path / "runs"
    assert main(["tune", "softmax", "--shape", "256x512", *NULL, "--budget", "4", "--runs-dir", str(runs),
                 "--quiet"]) == 0
    summary = json.loads((only_run(runs) / "summary.json").read_text())

    def shown(s) -> str:
        c = Console(width=300, record=True, file=io.StringIO())
        c.print(summary_table(s))
        return c.export_text()
    assert "timing noisy" not in shown(summary) and summary["flags"] == []  # null times do not spread
    assert summary["reference"]["interleaved"]  # the reference was re-timed beside the winner
    summary["best"]["iqr_s"] = summary["best"]["median_s"] * 2.5
    assert "timing noisy" in shown(summary) and "winner timing noisy: its IQR is 250% of its median" in shown(summary)
    summary["reference"]["iqr_s"] = summary["reference"]["median_s"] * 0.6
    assert "reference timing noisy: its IQR is 60% of its median" in shown(summary)
    # Tight samples, but the re-timing far from the search's figure: the load changed in between.
    assert summary["best"]["search_median_s"] == pytest.approx(summary["best"]["median_s"], rel=0.3)
    summary["best"]["search_median_s"] = summary["best"]["median_s"] / 4.5
    assert "winner timing moved: re-timed at 4.50x its median during the search" in " ".join(shown(summary).split())
    summary["best"]["search_median_s"] = summary["best"]["median_s"] * 1.4  # faster at the end, within MOVED
    assert "timing moved" not in shown(summary)
    # A winner slower than torch's own: the table says an export leaves its sizes to torch.
    assert "torch's own is faster" not in shown(summary)
    summary["best"]["speedup_vs_reference"] = 0.8
    assert "0.80x" in shown(summary) and "torch's own is faster here" in " ".join(shown(summary).split())


def test_evaluations_in_flight_are_what_keeps_the_device_busy_and_no_more():
    """Asks made while others are in flight learn nothing from them: a search with 15 compile
    workers asked its first 15 configs of 40 with nothing timed, and each later one with 14
    answers outstanding, while the GPU timed one kernel at a time and compiles took 0.2 s. In
    flight: the configs it was given to try first (here the default alone), then of its own
    asks at most IN_FLIGHT_START until answers come, no more than the answers so far, and no
    more than keeps the device fed at the pace measured (compile time over the gap between
    finished evaluations, plus two)."""
    import dataclasses
    import threading

    from tuner.offline import replay
    from tuner.run.pace import IN_FLIGHT_START, in_flight_cap
    from tuner.run.tune import run_search
    from tuner.search.searcher import prepare_searcher
    assert [in_flight_cap(15, d) for d in (0, 1, 2, 3, 5, 8, 14, 15, 40)] == [1, 1, 2, 3, 5, 8, 14, 15, 15]
    assert in_flight_cap(1, 0) == 1 and in_flight_cap(0, 9) == 1
    assert in_flight_cap(15, 40, 0.2, 0.2) == 3  # Triton on one GPU: one compiling, one timed, one ready
    assert in_flight_cap(15, 40, 15.0, 0.5) == 15  # nvcc: as many as the workers
    assert in_flight_cap(15, 40, 3.0, 1.0) == 5 and in_flight_cap(15, 4, 3.0, 1.0) == 4
    assert in_flight_cap(15, 40, 0.0, 0.0) == 2
    # eight devices: one timed on each and one ready, never fewer (a pace read from devices left
    # idle would hold the count down), plus the compiles their pace needs
    assert in_flight_cap(64, 40, 0.0, 0.01, slots=8) == 9
    assert in_flight_cap(64, 40, 0.25, 0.03, slots=8) == 18

    def run(compile_s: float) -> list[tuple[int, int]]:
        land = replay.synthetic("smooth", 0)
        ev = replay.ReplayEvaluator(land)
        lock, now, seen = threading.Lock(), [0], []
        real = ev.evaluate

        def evaluate(config, *a, **k):
            with lock:
                now[0] += 1
                seen.append((sum(1 for r in store.records() if r.status is not Status.INVALID), now[0]))
            time.sleep(0.01)
            try:
                r = real(config, *a, **k)
                return dataclasses.replace(r, build=dataclasses.replace(r.build, compile_s=compile_s))
            finally:
                with lock:
                    now[0] -= 1
        ev.evaluate = evaluate
        store = replay.MemoryStore()
        searcher = prepare_searcher(land.space, "random", 0, ev.check, ev.context, ev.limits)
        run_search(store, ev, searcher, 40, None, 15)
        assert len([r for r in store.records() if r.status is not Status.INVALID]) == 40
        assert all(n <= max(IN_FLIGHT_START, done) for done, n in seen), seen
        return seen
    assert max(n for _, n in run(0.0)) <= 3  # compiles take no time: one timed, one ready
    assert max(n for _, n in run(5.0)) >= 8  # compiles take far longer than a timing: the workers fill
