"""The Ray executor on a real local Ray cluster (2 CPUs, one cluster for this module): the same
records as the local executor, faults (killed device actors, crashing kernels), the CLI."""

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from tests.conftest import FIXTURES, ROOT
from tuner.cli.main import main
from tuner.core.ops import builtin_spec
from tuner.core.skeleton import load_skeleton
from tuner.core.values import Status
from tuner.run.store import Store
from tuner.run.tune import create_run, execute

ray = pytest.importorskip("ray")

from tests.conformance.runner_suite import *  # noqa: E402,F401,F403 - the runner suite, on Ray
from tests.conformance.runner_suite import SPEC  # noqa: E402
from tests.polling import wait_for  # noqa: E402
from tuner.exec.ray_executor import RAY_MISSING, RayExecutor, connect  # noqa: E402

LANDSCAPE = (FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")


@pytest.fixture(scope="module")
def cluster():
    # One thread per kernel process: these tests check behaviour, and OpenMP threads spinning on
    # an oversubscribed 2-core runner make every measurement many times slower.
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    owned = connect(num_cpus=2)
    yield
    if owned:
        ray.shutdown()
    if old is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = old


@pytest.fixture(scope="module")
def executor(cluster, tmp_path_factory):
    """Two null device actors, shared by the tests of this module (a dead one is replaced)."""
    from tuner.core.settings import Settings
    with RayExecutor(Settings(), devices=2) as ex:
        yield ex


@pytest.fixture
def make_evaluator(executor):
    return lambda skeleton, settings, workdir: executor.evaluator("null", SPEC, skeleton, settings, workdir)


def skel(pair):
    return load_skeleton(*pair)


def landscape_truth(config) -> Status:
    """What the landscape fixture scripts for a config (its constraints aside)."""
    c = config.as_dict()
    if c["BM"] == 256 and c["STAGES"] == 4:
        return Status.COMPILE_ERROR
    if c["BM"] == 16 and c["BN"] == 16:
        return Status.RUNTIME_ERROR
    if c["BM"] == 32 and c["BN"] == 512:
        return Status.WRONG_RESULT
    return Status.OK


def run(settings, make_evaluator, sampler="tpe", seed=5, budget=16, parallel=1, shape="256x512",
        pair=LANDSCAPE):
    store = create_run(settings, builtin_spec("softmax", shape), "null", skel(pair), sampler, seed)
    summary = execute(store, settings, budget, parallel=parallel, make_evaluator=make_evaluator)
    return store, summary


def essence(records):
    return [(r.config.key, r.status.value, r.seconds if r.status is Status.OK else None) for r in records]


def test_without_ray_installed_the_message_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["tune", "softmax", "--shape", "64x128", "--backend", "null", "--template", str(LANDSCAPE[0]),
               "--space", str(LANDSCAPE[1]), "--budget", "2", "--runs-dir", str(tmp_path / "runs"),
               "--executor", "ray", "--quiet"])
    assert rc == 2
    assert 'pip install "tuner[ray]"' in capsys.readouterr().err
    assert 'pip install "tuner[ray]"' in RAY_MISSING


def test_an_address_nobody_answers_at_fails_in_seconds_with_what_to_do():
    """Ray itself waited minutes for a cluster at a wrong address, printing only its warnings."""
    import socket
    import time

    from tuner.exec.ray_executor import RayUnavailable, _probe
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(RayUnavailable, match=rf"no Ray cluster answers at 127.0.0.1:{port}.*ray start --head"):
        _probe(f"127.0.0.1:{port}")
    with pytest.raises(RayUnavailable):
        _probe(f"ray://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 15
    _probe("auto")  # resolved by Ray itself


def test_core_imports_without_ray():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import tuner.cli.main, tuner.run.tune, tuner.sweeps.execute, tuner.serve.db, tuner.serve.runtime, tuner.exec.ray_executor\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_same_records_as_the_local_executor(executor, fast_settings, tmp_path):
    """One seeded search, one evaluation at a time: the very same sequence of records."""
    local, s1 = run(fast_settings, None)
    retries = executor.retries
    remote, s2 = run(fast_settings, executor.evaluator)
    assert executor.retries == retries
    a, b = essence(Store(local.path).records()), essence(Store(remote.path).records())
    assert a == b
    assert s1["best"]["config"] == s2["best"]["config"] and s1["best"]["median_s"] == s2["best"]["median_s"]
    assert {r.status for r in Store(remote.path).records()} >= {Status.OK, Status.INVALID}


def test_same_records_in_parallel_over_two_devices(executor, fast_settings):
    """A sampler whose asks do not depend on the answers: the same set of records, whatever the
    order in which two device actors finish them."""
    local, _ = run(fast_settings, None, sampler="random", seed=11, budget=16, parallel=3)
    remote, _ = run(fast_settings, executor.evaluator, sampler="random", seed=11, budget=16, parallel=4)
    assert sorted(essence(Store(local.path).records())) == sorted(essence(Store(remote.path).records()))
    for r in Store(remote.path).records():
        if r.status is not Status.INVALID:
            assert r.status is landscape_truth(r.config), (r.config, r.reason)


def test_crashing_kernel_is_retried_once_then_recorded(executor, fast_settings, tmp_path):
    pair = (FIXTURES / "null/mixed.txt.j2", FIXTURES / "null/mixed.yaml")

    def deaths():
        return sum(ray.get([s.actor.worker_deaths.remote() for s in executor.pool("null").slots]))
    before, retries = deaths(), executor.retries
    store, summary = run(fast_settings, executor.evaluator, sampler="random", budget=8, parallel=2,
                         shape="64x128", pair=pair)
    recs = Store(store.path).records()
    assert len(recs) == 8
    for r in recs:
        if r.config["BUG"]:
            assert r.status is Status.RUNTIME_ERROR and "SIGSEGV" in r.reason and "twice" in r.reason
        else:
            assert r.status is Status.OK
    # Four crashing configs, each killing a benchmark Worker twice: 8 deaths (counted where they
    # happen: counting restarts missed the last one when a slot's last call crashed).
    assert deaths() - before == 8
    assert executor.retries - retries == 4


def test_killed_device_actor(executor, fast_settings, tmp_path):
    """Kill the device actor's process while it measures a config: the actor is replaced and the
    config retried once; killed under it a second time, the config is RUNTIME_ERROR, and the
    pool still serves the next config."""
    settings = fast_settings.replace(run_timeout_s=90.0)
    sk = skel((FIXTURES / "ray/hang.txt.j2", FIXTURES / "ray/hang.yaml"))
    ex = executor
    replaced, retries = ex.pool("null").replaced, ex.retries
    ev = ex.evaluator("null", builtin_spec("softmax", "64x128"), sk, settings, tmp_path)
    ev.start()
    good = ev.evaluate(sk.space.default_config())
    assert good.status is Status.OK
    bad = next(c for c in sk.space.configs() if c["HANG"] == 1)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rec", ev.evaluate(bad)))
    t.start()
    killed = []
    for _ in range(2):
        def busy():
            return [x for x in ex.inflight() if str(bad) in x[2] and x[3] not in killed]
        assert wait_for(busy, 60), ex.inflight()
        pid = busy()[0][3]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    t.join(120)
    assert not t.is_alive()
    rec = result["rec"]
    assert rec.status is Status.RUNTIME_ERROR and "twice" in rec.reason, rec.reason
    pool = ex.pool("null")
    assert pool.replaced - replaced == 2 and len(pool.slots) == 2 and ex.retries - retries == 1
    other = next(c for c in sk.space.configs() if c["HANG"] == 0 and c["V"] == 2)
    assert ev.evaluate(other).status is Status.OK


def test_actor_killed_mid_search_loses_nothing(executor, fast_settings, tmp_path):
    """Kill a device actor in the middle of a search: records before it stay, every config is
    evaluated once, the budget is reached and each record says what the config scripts."""
    settings = fast_settings
    ex = executor
    replaced = ex.pool("null").replaced
    store = create_run(settings, builtin_spec("softmax", "512x1024"), "null", skel(LANDSCAPE), "tpe", 9)
    before = []

    def killer():
        path = store.path / "records.jsonl"
        wait_for(lambda: path.exists() and len(path.read_text().splitlines()) >= 10, 120)
        before.extend(path.read_text().splitlines())
        wait_for(lambda: any(x[2].startswith("measure") for x in ex.inflight()), 30, 0.005)
        busy = [x for x in ex.inflight() if x[2].startswith("measure")] or ex.inflight()
        os.kill(busy[0][3] if busy else ex.pool("null").slots[0].info["pid"], signal.SIGKILL)
    t = threading.Thread(target=killer)
    t.start()
    summary = execute(store, settings, 30, parallel=4, make_evaluator=ex.evaluator)
    t.join(60)
    assert ex.pool("null").replaced > replaced
    after = (store.path / "records.jsonl").read_text()
    lines = after.splitlines()
    assert lines[:len(before)] == before, "a record written before the kill was lost"
    recs = Store(store.path).records()
    keys = [r.config.key for r in recs]
    assert len(keys) == len(set(keys)), "a config was evaluated twice"
    assert summary["evaluations"] == 30
    for r in recs:
        if r.status is not Status.INVALID:
            assert r.status is landscape_truth(r.config), (r.config, r.reason)


def test_build_files_reach_a_node_without_them(cluster, tmp_path):
    from tuner.exec.ray_worker import _materialize
    ref = ray.put({"kernel.txt": b"time: 1e-4\n"})
    target = tmp_path / "elsewhere" / "kernel.txt"
    _materialize(str(target), [ref])
    assert target.read_bytes() == b"time: 1e-4\n"


def test_cli_tune_with_the_ray_executor(executor, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_MAX_REPS", "20")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    rc = main(["tune", "softmax", "--shape", "256x512", "--backend", "null", "--template", str(LANDSCAPE[0]),
               "--space", str(LANDSCAPE[1]), "--budget", "12", "--seed", "2", "--runs-dir", str(runs),
               "--executor", "ray", "--devices", "2", "--quiet"])
    assert rc == 0
    run_dir = next(runs.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluations"] == 12 and summary["best"]
    assert "best config" in capsys.readouterr().out


def test_cpu_backend_through_ray(executor, fast_settings, tmp_path):
    """Real C kernels: a CPU worker actor measures, compile tasks build; crashing configs become
    records as with the local executor."""
    pair = (FIXTURES / "faulty/mixed.c.j2", FIXTURES / "faulty/mixed.yaml")
    store = create_run(fast_settings, builtin_spec("softmax", "16x64"), "cpu", skel(pair), "random", 1)
    summary = execute(store, fast_settings, 4, make_evaluator=executor.evaluator)
    statuses = sorted(r.status.value for r in Store(store.path).records())
    assert statuses == ["OK", "OK", "RUNTIME_ERROR", "RUNTIME_ERROR"]
    assert summary["best"]["config"]["BUG"] == 0
    assert summary["reference"]["median_s"] > 0


def test_compile_processes_serve_every_op_of_a_sweep(tmp_path, fast_settings):
    """The op travels with each compile request: one compile Worker per Ray process, not one per op."""
    from tuner.exec import ray_worker
    ray_worker._COMPILE_WORKERS.clear()
    try:
        for i, shape in enumerate(["64x512", "128x512", "256x512", "512x512", "1024x512", "64x512"]):
            op = builtin_spec("softmax", shape, "fp32").to_json()
            (kind, build), _ = ray_worker.compile_in_task(
                "null", {}, fast_settings, None, {}, "time: 0.001\n", op, str(tmp_path / f"b{i}"), False)
            assert kind == "ok" and build.status.name == "OK", build
        workers = list(ray_worker._COMPILE_WORKERS.values())
        assert len(workers) == 1 and workers[0].started == 1
    finally:
        for w in ray_worker._COMPILE_WORKERS.values():
            w.close()
        ray_worker._COMPILE_WORKERS.clear()


def test_device_pool_keeps_a_task_at_home_and_lends_only_an_idle_device():
    """The pool's choice, without actors: requests go to their home actor; a free actor is
    taken by another's request only while none of its own waits for it."""
    import time

    from tuner.exec.ray_executor import DevicePool, _Slot
    pool = DevicePool.__new__(DevicePool)
    pool.backend = "null"
    pool.slots = [_Slot(0, None, {}), _Slot(1, None, {})]
    pool.free = list(pool.slots)
    pool.lock = threading.Lock()
    pool.cond = threading.Condition(pool.lock)
    pool.homed, pool.waiting, pool.requests, pool.away = {}, {}, 0, 0

    assert [pool.home(), pool.home(), pool.home()] == [0, 1, 0]
    pool.leave(0)
    pool.leave(0)
    assert pool.home() == 0  # the one with the fewest again

    assert pool.acquire("a", home=1).index == 1  # home, though actor 0 is free too
    s0 = pool.acquire("b", home=1)  # home busy, actor 0 idle: lent
    assert s0.index == 0 and pool.away == 1
    got = {}

    def want(name, home):
        got[name] = pool.acquire(name, home=home)
    waiters = [threading.Thread(target=want, args=("for 1", 1)), threading.Thread(target=want, args=("for 0", 0))]
    for t in waiters:
        t.start()
        time.sleep(0.2)
    pool.release(pool.slots[1])  # actor 1 frees: its own request takes it, not actor 0's
    waiters[0].join(timeout=5)
    assert got["for 1"].index == 1 and "for 0" not in got
    pool.release(s0)
    waiters[1].join(timeout=5)
    assert got["for 0"].index == 0 and pool.away == 1 and pool.requests == 4
    pool.release(got["for 0"])
    pool.release(got["for 1"])
    pool.slots.remove(pool.slots[0])  # actor 0 died and could not be placed again
    assert pool.acquire("orphan", home=0).index == 1  # its tasks go on elsewhere
    assert pool.home() == 1
