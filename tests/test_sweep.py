"""Sweeps: ops x shapes x dtypes in one command, budgets, resume, the summary; local and Ray."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tuner.cli import NO_WINNER
from tuner.cli.main import main
from tuner.run.store import Store
from tuner.sweeps.plan import SweepError, load_plan

SWEEP = FIXTURES / "sweep/null.yaml"


@pytest.fixture(autouse=True)
def fast(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_MAX_REPS", "20")
    monkeypatch.setenv("TUNER_WARMUP_S", "0")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # behaviour, not speed: no spinning threads


def records(folder):
    return {p.name: [json.dumps(r.to_json()) for r in Store(p).records()]
            for p in sorted((folder / "tasks").iterdir())}


def test_plan_expands_ops_shapes_dtypes(tmp_path):
    plan = load_plan(SWEEP)
    assert [t.key for t in plan.tasks] == ["softmax-256x512-fp32-null", "softmax-512x512-fp32-null",
                                           "rmsnorm-256x512-fp32-null"]
    assert all(t.budget == 6 for t in plan.tasks)
    assert plan.sampler == "random"
    (tmp_path / "d.yaml").write_text("\n".join(line for line in SWEEP.read_text().splitlines()
                                               if not line.startswith("sampler:"))
                                     .replace("../null/", str(FIXTURES / "null") + "/"))
    assert load_plan(tmp_path / "d.yaml").sampler == "guided"  # tuner tune's default searcher
    text = SWEEP.read_text().replace("budget: 6", "total_budget: 10")
    (tmp_path / "s.yaml").write_text(text.replace("../null/", str(FIXTURES / "null") + "/"))
    assert [t.budget for t in load_plan(tmp_path / "s.yaml").tasks] == [4, 3, 3]


def test_later_shapes_of_an_op_warm_start_from_its_first(tmp_path):
    plan = load_plan(SWEEP)
    first, second, other = plan.tasks
    assert plan.anchor(first) is None and plan.anchor(other) is None
    assert plan.anchor(second) is first
    assert plan.patience is None
    text = SWEEP.read_text().replace("../null/", str(FIXTURES / "null") + "/")
    (tmp_path / "cold.yaml").write_text(text + "\nwarm_start: false\npatience: 4\n")
    cold = load_plan(tmp_path / "cold.yaml")
    assert [cold.anchor(t) for t in cold.tasks] == [None] * 3 and cold.patience == 4
    # An entry of its own with `warm_start: false`: cold, and no warm start for the op's others.
    (tmp_path / "own.yaml").write_text(text.replace("  rmsnorm:", "  wide:\n    op: softmax\n    shapes: [64x4096]\n"
                                                    "    warm_start: false\n    template: " + str(FIXTURES / "null")
                                                    + "/landscape.txt.j2\n    space: " + str(FIXTURES / "null")
                                                    + "/landscape.yaml\n  rmsnorm:"))
    own = load_plan(tmp_path / "own.yaml")
    assert [t.key for t in own.tasks] == ["softmax-256x512-fp32-null", "softmax-512x512-fp32-null",
                                          "softmax-64x4096-fp32-null", "rmsnorm-256x512-fp32-null"]
    assert [own.anchor(t) for t in own.tasks] == [None, own.tasks[0], None, None]
    (tmp_path / "bad.yaml").write_text((tmp_path / "own.yaml").read_text().replace("warm_start: false", "warm_start: 0"))
    with pytest.raises(SweepError, match="ops.wide: `warm_start:` must be true or false"):
        load_plan(tmp_path / "bad.yaml")
    for extra, words in [("warm_start: yes please", "true or false"), ("patience: 0", "at least 1"),
                         ("patience: soon", "an integer")]:
        (tmp_path / "bad.yaml").write_text(text + "\n" + extra + "\n")
        with pytest.raises(SweepError, match=words):
            load_plan(tmp_path / "bad.yaml")


@pytest.mark.parametrize("text, words", [
    ("ops: {nosuchop: {shapes: [1x2]}}", "unknown op"),
    ("ops: {softmax: {shapes: [12]}}", "bad shape"),
    ("backend: cpu\nops: {add_rmsnorm: {shapes: [64x64]}}", "no c skeleton"),
    ("ops: {softmax: {}}", "shapes"),
    ("budget: 3\ntotal_budget: 9\nops: {softmax: {shapes: [64x64]}}", "not both"),
    ("bogus: 1\nops: {softmax: {shapes: [64x64]}}", "unknown key"),
    ("ops: {x.py: {shapes: [64]}}", "goes under `problem:`"),
    ("ops: {relu: {problem: KB/relu.py, sizes: [{dim: 64}]}}", "its own `template:` and `space:`"),
    ("ops: {relu: {problem: KB/relu.py, sizes: [{dim: 6.5}], template: KB/relu_null.txt.j2, "
     "space: KB/relu_null.yaml}}", "constant names to integers"),
    ("ops: {relu: {problem: KB/relu.py, sizes: [{nope: 3}], template: KB/relu_null.txt.j2, "
     "space: KB/relu_null.yaml}}", "nope"),
    ("ops: {relu: {problem: KB/missing.py, template: KB/relu_null.txt.j2, space: KB/relu_null.yaml}}",
     "does not exist"),
])
def test_bad_sweep_files_fail_before_any_run(tmp_path, capsys, text, words):
    f = tmp_path / "bad.yaml"
    f.write_text(text.replace("KB/", str(FIXTURES / "kernelbench") + "/"))
    with pytest.raises(SweepError, match=words):
        load_plan(f, "null" if "backend" not in text else None)
    assert main(["sweep", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert not (tmp_path / "out").exists()


def test_a_sweep_whose_task_passes_no_config_says_so_in_its_exit_code(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(f"""backend: "null"
budget: 2
ops:
  works:
    op: softmax
    shapes: [64x128]
    template: {FIXTURES / "null/landscape.txt.j2"}
    space: {FIXTURES / "null/landscape.yaml"}
  broken:
    op: softmax
    shapes: [16x64]
    template: {FIXTURES / "faulty/nocompile.c.j2"}
    space: {FIXTURES / "faulty/nocompile.yaml"}
""")
    assert main(["sweep", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == NO_WINNER
    assert "no config passed" in capsys.readouterr().out


def test_local_sweep_runs_resumes_and_summarises(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", str(SWEEP), "--out", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    for words in ("softmax", "rmsnorm", "256x512", "% of ceiling", "vs reference", "failures", "done, warm"):
        assert words in table
    summary = json.loads((out / "summary.json").read_text())
    assert [r["state"] for r in summary["tasks"]] == ["done"] * 3
    for r in summary["tasks"]:
        assert r["evaluations"] == 6 and r["best_s"] and r["ceiling_percent"] and r["speedup_vs_reference"]
        assert Store.open(r["run"]).meta().sweep == "null-sweep"
    # softmax's second shape started from its first: that one's best config right after the default.
    assert [r["warm_start"] for r in summary["tasks"]] == [[], ["softmax-256x512-fp32-null"], []]
    anchor, later = (Store(out / "tasks" / k) for k in ("softmax-256x512-fp32-null", "softmax-512x512-fp32-null"))
    assert later.meta().warm_start == (str(anchor.path.resolve()),)
    timed = {r.config.key: r.seconds for r in anchor.records() if r.status.value == "OK"}
    # Asked in this order (records are in the order evaluations finished, two at a time).
    tried = [r.config.key for r in sorted(later.records(), key=lambda r: r.trial) if r.status.value != "INVALID"]
    assert timed.get(tried[1]) == min(timed.values())  # one of the fastest (scripted times tie)
    first = records(out)

    # The same command again: nothing is redone.
    assert main(["sweep", str(SWEEP), "--out", str(out), "--quiet"]) == 0
    assert records(out) == first

    # A task killed mid-search (summary gone, three records on disk) continues from them.
    task = out / "tasks" / "softmax-512x512-fp32-null"
    (task / "summary.json").unlink()
    lines = (task / "records.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["build"]["status"] != "INVALID"][:3]
    (task / "records.jsonl").write_text("\n".join(kept) + "\n")
    shutil.rmtree(task / "best")
    capsys.readouterr()
    assert main(["sweep", str(SWEEP), "--out", str(out), "--quiet", "--json"]) == 0
    after = Store(task).records()
    assert [r.to_json() for r in after[:3]] == [json.loads(ln) for ln in kept]
    assert sum(r.status.value != "INVALID" for r in after) == 6
    assert records(out)["softmax-256x512-fp32-null"] == first["softmax-256x512-fp32-null"]
    assert json.loads(capsys.readouterr().out)["tasks"][1]["evaluations"] == 6

    # The sweep's folder is not a run; `show` says where its runs are, `list` lists them.
    assert main(["show", str(out)]) == 2
    assert f"{out} is a sweep's folder, not a run: its runs are under {out / 'tasks'}" in capsys.readouterr().err
    assert main(["list", "--runs-dir", str(out)]) == 0
    listed = capsys.readouterr().out
    assert all(k in listed for k in ("softmax-256x512-fp32-null", "softmax-512x512-fp32-null", "rmsnorm-256x512"))


def test_ray_sweep_gives_the_local_winners(tmp_path):
    """All tasks at once over two device actors of a local Ray cluster: per task the same
    evaluated configs (a seeded random sampler) and so the same winner as the local sweep."""
    pytest.importorskip("ray")
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", str(SWEEP), "--out", str(local), "--quiet"]) == 0
    assert main(["sweep", str(SWEEP), "--out", str(remote), "--quiet", "--executor", "ray",
                 "--devices", "2"]) == 0
    a = json.loads((local / "summary.json").read_text())["tasks"]
    b = json.loads((remote / "summary.json").read_text())["tasks"]
    assert [(r["task"], r["best_s"]) for r in a] == [(r["task"], r["best_s"]) for r in b]
    for ra, rb in zip(a, b):
        recs = {r.config.key: r for r in Store(local / "tasks" / ra["task"]).records()}
        # Configs with equal scripted times tie; the winner is one of the tied fastest.
        assert recs[json.dumps(rb["best_config"], sort_keys=True, separators=(",", ":"))].seconds == ra["best_s"]
    for name in os.listdir(local / "tasks"):
        ka = sorted((r.config.key, r.status.value) for r in Store(local / "tasks" / name).records())
        kb = sorted((r.config.key, r.status.value) for r in Store(remote / "tasks" / name).records())
        assert ka == kb
    assert json.loads((remote / "summary.json").read_text())["executor"] == "ray"
    # softmax's second shape waited for its first, which it is warm-started from.
    anchor, later = (remote / "tasks" / k for k in ("softmax-256x512-fp32-null", "softmax-512x512-fp32-null"))
    assert (anchor / "summary.json").stat().st_mtime <= (later / "run.json").stat().st_mtime


def test_a_shape_yaml_reads_as_a_number_says_quote_it(tmp_path):
    from tuner.sweeps.plan import SweepError, load_plan
    f = tmp_path / "s.yaml"
    f.write_text("backend: cpu\nops:\n  softmax: {shapes: [64x64, 0x40]}\n")
    with pytest.raises(SweepError, match="bad shape 64: a number.*quoted if it starts with 0x"):
        load_plan(f)


def test_runs_of_a_local_sweep_share_their_worker_processes(fast_settings, tmp_path):
    import functools

    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import library_skeleton
    from tuner.exec.evaluate import Evaluator
    from tuner.exec.runner import WorkerPools
    from tuner.run.tune import create_run, execute
    pools = WorkerPools(fast_settings, tmp_path / "workers.log")
    try:
        for op, shape in [("softmax", "16x100"), ("rmsnorm", "8x64"), ("softmax", "4x32")]:
            store = create_run(fast_settings, builtin_spec(op, shape, "fp32"), "cpu", library_skeleton(op, "c"),
                               "random", seed=1, path=tmp_path / f"{op}-{shape}")
            summary = execute(store, fast_settings, 2, make_evaluator=functools.partial(Evaluator, runner=pools.runner))
            assert summary["best"] is not None, summary["failures"]
        [(compilers, benchers)] = pools._pools.values()
        assert len(compilers) == fast_settings.n_compile_workers and len(benchers) == 1
        assert benchers[0].started == 1 and all(w.started <= 1 for w in compilers)  # kept across runs
    finally:
        pools.close()


def test_a_sweep_over_a_problem_file_runs_one_task_per_sizes_override(tmp_path, capsys):
    kb = FIXTURES / "kernelbench"
    f = tmp_path / "kb.yaml"
    f.write_text(f"""backend: "null"
budget: 3
ops:
  relu:
    problem: {kb / 'relu.py'}
    sizes: [{{batch_size: 4}}, {{batch_size: 8, dim: 256}}]
    template: {kb / 'relu_null.txt.j2'}
    space: {kb / 'relu_null.yaml'}
""")
    plan = load_plan(f)
    assert [t.key for t in plan.tasks] == ["relu-batch_size=4-fp32-null", "relu-batch_size=8_dim=256-fp32-null"]
    assert plan.tasks[1].spec.size_dict() == {"batch_size": 8, "dim": 256}
    out = tmp_path / "out"
    assert main(["sweep", str(f), "--out", str(out), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in summary["tasks"]] == ["done", "done"]
    assert all(r["evaluations"] == 3 and r["best_s"] for r in summary["tasks"])
    meta = Store.open(summary["tasks"][1]["run"]).meta()
    assert meta.op.kind == "kernelbench" and meta.op.size_dict() == {"batch_size": 8, "dim": 256}


def test_a_first_task_where_nothing_passed_is_named_so(tmp_path):
    """The later shapes of an op go on cold, with a note that says why."""
    from tuner.run.tune import _related
    out = tmp_path / "sweep"
    assert main(["sweep", str(SWEEP), "--out", str(out), "--quiet", "--json"]) == 0
    anchor = out / "tasks" / "softmax-256x512-fp32-null"
    lines = (anchor / "records.jsonl").read_text().splitlines()
    (anchor / "records.jsonl").write_text("\n".join(ln for ln in lines if '"status":"OK"' not in ln) + "\n")
    later = Store(out / "tasks" / "softmax-512x512-fp32-null")
    notes = []
    view = type("View", (), {"note": lambda self, text: notes.append(text)})()
    warm, prior = _related(later.meta().replace(sampler="guided"), later.skeleton().space, view)
    assert warm == () and prior == ()
    assert notes == [f"not warm-starting from {anchor.resolve()}: no config passed there"]


def test_an_unexpected_error_in_a_first_task_does_not_leave_its_later_tasks_waiting(tmp_path, monkeypatch):
    """Under Ray two lanes: one dies with the first softmax task, the other would wait for it forever."""
    pytest.importorskip("ray")
    import threading

    from tuner.core.settings import Settings
    from tuner.sweeps import execute as sweep
    real = sweep.execute

    def execute(store, *a, **k):
        if store.path.name == "softmax-256x512-fp32-null":
            raise RuntimeError("a bug")
        return real(store, *a, **k)

    monkeypatch.setattr(sweep, "execute", execute)
    raised = []

    def go():
        try:
            sweep.run_sweep(load_plan(SWEEP), Settings.from_env(), "ray", devices=1, concurrency=2,
                            out=str(tmp_path / "s"), view_enabled=False)
        except RuntimeError as e:
            raised.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(240)
    assert not t.is_alive(), "the sweep hung"
    assert [str(e) for e in raised] == ["a bug"]
    assert (tmp_path / "s" / "tasks" / "softmax-512x512-fp32-null" / "summary.json").is_file()


def test_a_task_stopped_by_patience_is_done_on_a_rerun_unless_asked_for_more(tmp_path):
    text = SWEEP.read_text().replace("../null/", str(FIXTURES / "null") + "/").replace("budget: 6", "budget: 40")
    (tmp_path / "p.yaml").write_text(text + "\npatience: 2\n")
    out = tmp_path / "sweep"
    assert main(["sweep", str(tmp_path / "p.yaml"), "--out", str(out), "--quiet", "--json"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    stopped = [r for r in summary["tasks"] if r["evaluations"] < 40]
    assert stopped, "no task stalled within the budget"
    for r in stopped:
        said = json.loads((Path(r["run"]) / "summary.json").read_text())["search_stopped"]
        assert said.startswith("--patience 2: the last 2 evaluations found nothing")
    before = {r["task"]: (Path(r["run"]) / "summary.json").stat().st_mtime_ns for r in stopped}
    first = records(out)
    assert main(["sweep", str(tmp_path / "p.yaml"), "--out", str(out), "--quiet", "--json"]) == 0
    assert records(out) == first
    assert {r["task"]: (Path(r["run"]) / "summary.json").stat().st_mtime_ns for r in stopped} == before
    # Asked for more (another patience), the stopped tasks search on, each its own window.
    (tmp_path / "p.yaml").write_text(text + "\npatience: 4\n")
    assert main(["sweep", str(tmp_path / "p.yaml"), "--out", str(out), "--quiet", "--json"]) == 0
    for r in stopped:
        after = json.loads((Path(r["run"]) / "summary.json").read_text())
        assert after["evaluations"] >= min(40, r["evaluations"] + 4)
        assert after.get("search_stopped", "--patience 4").startswith("--patience 4")


def test_ctrl_c_stops_a_sweep_promptly_and_a_rerun_resumes_it(tmp_path):
    """The tasks run on lane threads: Ctrl-C used to leave them running until the whole sweep
    was done. Now the running task records what it has in flight and ends, no other starts,
    the command exits 130 naming itself, and a re-run finishes from the records."""
    import signal
    import subprocess
    import sys
    import time
    # The first task long enough to be stopped in; the two after it as short as the fixture's.
    text = SWEEP.read_text().replace("../null/", str(FIXTURES / "null") + "/").replace(
        "    shapes: [256x512, 512x512]\n", "    shapes: [256x512]\n    budget: 60\n", 1)
    text += (f"  softmax_later:\n    op: softmax\n    shapes: [512x512]\n"
             f"    template: {FIXTURES / 'null/landscape.txt.j2'}\n    space: {FIXTURES / 'null/landscape.yaml'}\n")
    (tmp_path / "s.yaml").write_text(text)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tuner", "sweep", str(tmp_path / "s.yaml"), "--out", str(out)]
    env = {**os.environ, "TUNER_BENCH_BUDGET_S": "0.01"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[1])
    first = out / "tasks" / "softmax-256x512-fp32-null" / "records.jsonl"
    deadline = time.monotonic() + 60
    while not (first.is_file() and len(first.read_text().splitlines()) >= 5):
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before it could be stopped"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("Ctrl-C did not stop the sweep")
    assert time.monotonic() - t0 < 15
    assert proc.returncode == 130 and f"continue with `tuner sweep {tmp_path / 's.yaml'} --out {out}`" in err
    states = {r["task"]: r["state"] for r in json.loads((out / "summary.json").read_text())["tasks"]}
    assert states == {"softmax-256x512-fp32-null": "interrupted", "softmax-512x512-fp32-null": "waiting",
                      "rmsnorm-256x512-fp32-null": "waiting"}
    assert not (out / "tasks" / "softmax-256x512-fp32-null" / "summary.json").exists()
    def evaluated():
        return [r.config.key for r in Store(first.parent).records() if r.status.value != "INVALID"]
    assert 1 <= len(evaluated()) < 60
    assert main(["sweep", str(tmp_path / "s.yaml"), "--out", str(out), "--quiet", "--json"]) == 0
    assert len(evaluated()) == len(set(evaluated())) == 60  # resumed: nothing evaluated twice
