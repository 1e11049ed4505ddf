"""Real failures of real C kernels, pinned: each must become a record while the run completes."""

import json

import pytest

from tests.conftest import FIXTURES
from tuner.cli import NO_WINNER
from tuner.cli.main import main
from tuner.core.ops import builtin_spec
from tuner.core.skeleton import load_skeleton
from tuner.core.values import Config, Status
from tuner.exec.evaluate import Evaluator
from tuner.run.store import Store


def test_spinning_kernel_hits_the_cpu_limit(fast_settings, tmp_path):
    """A kernel that burns CPU is stopped by the per-request CPU limit (SIGXCPU) even when
    the wall-clock timeout is far away."""
    skel = load_skeleton(FIXTURES / "faulty/hang.c.j2", FIXTURES / "faulty/hang.yaml")
    ev = Evaluator("cpu", builtin_spec("softmax", "8x16"), skel, fast_settings.replace(
        worker_cpu_s=2, run_timeout_s=120.0), tmp_path)
    try:
        ev.start()
        rec = ev.evaluate(skel.space.default_config())
        assert rec.status is Status.RUNTIME_ERROR and "SIGXCPU" in rec.reason
    finally:
        ev.close()


def test_cpu_run_with_crashing_configs_completes(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    rc = main(["tune", "softmax", "--shape", "16x64", "--backend", "cpu",
               "--template", str(FIXTURES / "faulty/mixed.c.j2"), "--space", str(FIXTURES / "faulty/mixed.yaml"),
               "--budget", "10", "--runs-dir", str(runs), "--quiet"])
    assert rc == 0
    run = next(runs.iterdir())
    statuses = sorted(r.status.value for r in Store.open(run).records())
    assert statuses == ["OK", "OK", "RUNTIME_ERROR", "RUNTIME_ERROR"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["config"]["BUG"] == 0
    assert summary["failures"]["RUNTIME_ERROR"]["count"] == 2
    assert "SIGSEGV" in summary["failures"]["RUNTIME_ERROR"]["example"]


def test_run_where_nothing_compiles_reports_no_winner(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    rc = main(["tune", "softmax", "--shape", "16x64", "--backend", "cpu",
               "--template", str(FIXTURES / "faulty/nocompile.c.j2"),
               "--space", str(FIXTURES / "faulty/nocompile.yaml"), "--runs-dir", str(runs), "--quiet"])
    assert rc == NO_WINNER  # the search ran, nothing to use: a script sees it
    out = capsys.readouterr().out
    assert "no config passed verification" in out and "COMPILE_ERROR" in out
    run = next(runs.iterdir())
    assert json.loads((run / "summary.json").read_text())["best"] is None
    assert main(["export", str(run)]) == 2


def test_a_kernel_that_forks_or_exits_is_refused_before_it_runs(fast_settings, tmp_path):
    """A kernel that forked a child holding the worker's pipe, or ended the process (exit,
    abort), used to run and be recorded after the fact; every config's source and compiled
    object are now checked, and such a kernel never runs."""
    skel = load_skeleton(FIXTURES / "faulty/forkdie.c.j2", FIXTURES / "faulty/forkdie.yaml")
    ev = Evaluator("cpu", builtin_spec("softmax", "8x16"), skel, fast_settings, tmp_path)
    try:
        ev.start()
        for config in skel.space.configs():
            rec = ev.evaluate(config)
            assert rec.status is Status.COMPILE_ERROR and rec.reason.startswith("forbidden:"), rec.reason
    finally:
        ev.close()


def _maps(pid: str, folder: str) -> bool:
    """Whether process `pid` has a file under `folder` mapped (a kernel built there)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return folder in f.read()
    except OSError:
        return False


def test_a_kernel_that_writes_just_outside_a_buffer_is_a_wrong_result(fast_settings, tmp_path):
    """A store a few elements past the end of an output (or before its start, or past an
    input) lands in a guard band around the buffer: the config is a WRONG_RESULT that says
    where, instead of a corrupted heap that crashes the worker later, or nothing at all."""
    skel = load_skeleton(FIXTURES / "faulty/stray.c.j2", FIXTURES / "faulty/stray.yaml")
    ev = Evaluator("cpu", builtin_spec("softmax", "8x16"), skel, fast_settings, tmp_path)
    try:
        ev.start()
        recs = {s: ev.evaluate(Config.of({"STRAY": s})) for s in ("none", "tail", "head", "input")}
    finally:
        ev.close()
    assert recs["none"].status is Status.OK
    assert recs["tail"].status is Status.WRONG_RESULT
    assert "past the end of output y (as far as 3 element(s) beyond it)" in recs["tail"].reason
    assert recs["head"].status is Status.WRONG_RESULT
    assert "before the start of output y (as far as 1 element(s) before it)" in recs["head"].reason
    # An input's pages are read-only: a store past its end faults at once.
    assert recs["input"].status is Status.RUNTIME_ERROR and "read-only" in recs["input"].reason


def test_a_worker_cannot_write_a_file_past_the_log_limit(fast_settings, tmp_path, monkeypatch):
    """What candidate code prints goes to the run's workers.log (a Triton kernel's
    device_print prints once per timed repetition): no file a worker writes may pass
    LOG_LIMIT, and a worker started on a log past half of it moves the log aside. (A C kernel
    that prints is refused before it runs: tests/test_redteam.py.)"""
    import re
    from pathlib import Path

    from tuner.exec import worker
    monkeypatch.setattr(worker, "LOG_LIMIT", 2**20)
    log = tmp_path / "workers.log"
    log.write_bytes(b"x" * (2**19 + 1))
    w = worker.Worker("null", 0, {}, fast_settings, str(log))
    try:
        pid = w.call("ping", timeout=60)
        assert re.search(r"Max file size\s+1048576\s+1048576", Path(f"/proc/{pid}/limits").read_text())
    finally:
        w.close()
    assert (tmp_path / "workers.log.1").stat().st_size == 2**19 + 1
    assert log.read_text().startswith("[tuner] the output before this was moved to workers.log.1")
    skel = load_skeleton(FIXTURES / "faulty/chatty.c.j2", FIXTURES / "faulty/chatty.yaml")
    ev = Evaluator("cpu", builtin_spec("softmax", "8x16"), skel, fast_settings, tmp_path / "chatty")
    try:
        ev.start()
        rec = ev.evaluate(Config.of({"LINES": 1024}))
    finally:
        ev.close()
    assert rec.status is Status.COMPILE_ERROR and "stdio.h" in rec.reason, rec.reason


@pytest.mark.parametrize("name, entry, wrong", [
    # argmax returns int64: the entry says `int64_t *out0` (after its header), and the check and
    # the timing both hand the kernel int64 buffers (the timing gave it a float32 one, half the
    # size: the kernel's writes corrupted the heap and every multi-threaded config crashed).
    ("argmax", "    #include <stdint.h>\n    void tuner_kernel(const {{ ctype }} *in0, int64_t *out0)\n", "SHIFT"),
    # `x > 0`: the entry said `bool *out0` without the header C needs for it (copied as printed:
    # "unknown type name 'bool'"), and the check subtracted the bool reference, which torch
    # refuses: every config, right or wrong, was a RUNTIME_ERROR.
    ("positive", "    #include <stdbool.h>\n    void tuner_kernel(const {{ ctype }} *in0, bool *out0)\n", "LOOSE"),
])
def test_a_problem_with_an_integer_or_bool_output(tmp_path, monkeypatch, capsys, name, entry, wrong):
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    problem = str(FIXTURES / f"kernelbench/{name}.py")
    assert main(["tune", "--op", problem, "--backend", "cpu", "--runs-dir", str(tmp_path / "none")]) == 2
    assert entry in capsys.readouterr().err
    runs = tmp_path / "runs"
    assert main(["tune", "--op", problem, "--backend", "cpu", "--template", str(FIXTURES / f"kernelbench/{name}.c.j2"),
                 "--space", str(FIXTURES / f"kernelbench/{name}.yaml"), "--budget", "4", "--parallel", "1",
                 "--runs-dir", str(runs), "--quiet"]) == 0
    records = Store.open(next(runs.iterdir())).records()
    assert len(records) == 4
    for r in records:
        assert r.status is (Status.WRONG_RESULT if r.config.as_dict()[wrong] else Status.OK), (r.config, r.reason)


def test_a_worker_whose_parent_died_while_it_started_exits():
    """A device actor killed while its benchmark worker was still starting left the worker to
    init; the worker took init for its parent and hung on in a kernel forever. The parent's
    pid now comes on the command line: a worker that finds another parent exits at once."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    child = subprocess.Popen([sys.executable, "-m", "tuner.exec.worker", str(os.getpid() + 999_999)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.wait(timeout=60) == 1
    finally:
        child.kill()


def test_a_kernel_that_ignores_parameters_constant_at_init_is_wrong(fast_settings, tmp_path):
    """A LayerNorm's weight is ones and its bias zeros at init: verified with those, a kernel
    that ignores both passed, and its export was wrong with real weights. Each verification set
    now draws the parameters anew (the reference with the same values)."""
    from tests.conftest import FIXTURES
    from tuner.core.ops import load_op
    from tuner.core.problem import spec_from_problem_file
    from tuner.core.skeleton import load_skeleton
    from tuner.core.values import Status
    from tuner.exec.evaluate import Evaluator
    kb = FIXTURES / "kernelbench"
    spec = spec_from_problem_file(kb / "layernorm.py")
    op = load_op(spec)
    x, w, b = op.make_inputs(3)
    assert not bool((w == 1).all()) and not bool((b == 0).all())
    sk = load_skeleton(kb / "layernorm.c.j2", kb / "layernorm.yaml")
    ev = Evaluator("cpu", spec, sk, fast_settings, tmp_path)
    try:
        ev.start()
        statuses = {c["AFFINE"]: ev.evaluate(c).status for c in sk.space.configs()}
    finally:
        ev.close()
    assert statuses == {True: Status.OK, False: Status.WRONG_RESULT}, statuses


def test_a_c_kernel_calling_an_undeclared_function_is_told_so_with_its_line(tmp_path):
    """It was reported as "no exported tuner_kernel entry: undefined symbol: max" (the
    compiler's warning, with its line, was dropped); now the compiler refuses it and says where."""
    from tuner.backends.cpu import CpuBackend
    from tuner.core.ops import builtin_spec
    from tuner.core.values import Status
    src = ("void tuner_kernel(const float *x, float *y) {\n"
           "  for (long i = 0; i < 4; i++)\n"
           "    y[i] = max(x[i], 0.0f);\n"
           "}\n")
    build = CpuBackend(0).compile(src, builtin_spec("softmax", "2x2"), str(tmp_path), 60)
    assert build.status is Status.COMPILE_ERROR
    assert "implicit declaration of function 'max'" in build.error and ":3:" in build.error, build.error


def test_a_compilers_own_diagnostics_reach_the_compile_error():
    """MLIR prints the failing op with its location to stderr; the exception only says
    "PassManager::run failed". What native code writes to fd 2 during a compile is kept."""
    import os

    from tuner.backends.base import CapturedStderr, with_diagnostics
    try:
        with CapturedStderr() as captured:
            os.write(2, b'loc("kernel.py":12:5): error: \'tt.dot\' op operand #0 must be a tensor\nunrelated\n')
            raise RuntimeError("PassManager::run failed")
    except RuntimeError as e:
        said = with_diagnostics(f"compile error: {e}", captured)
    assert said.startswith("compile error: PassManager::run failed")
    assert 'kernel.py":12:5): error: \'tt.dot\'' in said and "unrelated" not in said


ADAPTER_CRASH = """triton.compiler.errors.MLIRCompilationError:
///------------------[ERROR][Triton][BEG]------------------
[ConvertTritonIRToLinalgIR] encounters error:
PLEASE submit a bug report to https://github.com/llvm/llvm-project/issues/ and include the crash backtrace.
Stack dump:
0.\tProgram arguments: triton-adapter-opt kernel.ttir.mlir --triton-to-linalg -o kernel.ttadapter.mlir
corrupted size vs. prev_size
 #0 0x0000555bbe88b135 (triton-adapter-opt+0xb65135)
 #1 0x0000555bbe8918b4 (triton-adapter-opt+0xb6b8b4)
///------------------[ERROR][Triton][END]------------------
"""


def test_a_compiler_that_crashes_is_tried_again_and_then_named():
    """triton-ascend's adapter aborted on its own heap corruption on about one compile in ten
    of one matmul config (CI lost the config as a COMPILE_ERROR whose excerpt was backtrace
    addresses). A compile whose compiler process died by a signal is tried again; one that
    fails with a message is not; the backtrace's frames are left out of what is said."""
    import subprocess
    import sys

    from tuner.backends.base import (COMPILER_CRASH_TRIES, compiler_crash, retrying_compiler_crashes,
                                     without_stack_frames)
    tries = []

    def crashes_until(n):
        def once(attempt):
            tries.append(attempt)
            if attempt < n:
                try:  # a real process that aborts, as the adapter did
                    subprocess.run([sys.executable, "-c", "import os; os.abort()"], check=True,
                                   capture_output=True)
                except subprocess.CalledProcessError as e:
                    raise RuntimeError(ADAPTER_CRASH) from e
            return "compiled"
        return once
    assert retrying_compiler_crashes(crashes_until(2)) == "compiled" and tries == [1, 2]
    tries.clear()
    with pytest.raises(RuntimeError) as crashed:
        retrying_compiler_crashes(crashes_until(99))
    assert tries == list(range(1, COMPILER_CRASH_TRIES + 1))
    assert compiler_crash(str(crashed.value.__cause__)) == "SIGABRT"
    tries.clear()

    def says_why(attempt):
        tries.append(attempt)
        raise RuntimeError("error: 'tt.dot' op operand #0 must be a tensor")
    with pytest.raises(RuntimeError):
        retrying_compiler_crashes(says_why)
    assert tries == [1]
    said = without_stack_frames(ADAPTER_CRASH)
    assert "corrupted size vs. prev_size" in said and "0x0000555bbe88b135" not in said
    assert "(2 backtrace frames left out)" in said


def test_the_roofline_holds_an_op_to_the_bound_that_binds():
    """A matmul whose bytes take longer than its FLOPs at the measured peaks (a skinny shape)
    is held to bandwidth, and one whose FLOPs take longer to the FLOP rate, whatever its
    FLOPs per byte; the percent is the bound's time over the time taken."""
    from tuner.core.ops import ceiling
    peaks = {"copy_gbps": 100.0, "fp32_gflops": 1000.0}
    # 5 flops a byte, under this device's ridge (1000 / 100 = 10): memory-bound.
    skinny = ceiling(flops=5e8, nbytes=1e8, seconds=2e-3, dtype="fp32", peaks=peaks)
    assert skinny["unit"] == "GB/s" and abs(skinny["percent"] - 50.0) < 1e-9
    # 100 flops a byte: compute-bound.
    square = ceiling(flops=1e10, nbytes=1e8, seconds=2e-2, dtype="fp32", peaks=peaks)
    assert square["unit"] == "GFLOP/s" and abs(square["percent"] - 50.0) < 1e-9
    # 5 flops a byte on a device whose ridge is at 2: compute-bound (the old rule said memory).
    slow_fpu = ceiling(flops=5e8, nbytes=1e8, seconds=1e-2, dtype="fp32", peaks={"copy_gbps": 100.0,
                                                                            "fp32_gflops": 200.0})
    assert slow_fpu["unit"] == "GFLOP/s"
    assert ceiling(flops=None, nbytes=1e8, seconds=1e-3, dtype="fp32", peaks={}) is None


def test_two_threads_calling_one_worker_each_get_their_own_answer(fast_settings, tmp_path):
    """Two runners over the same workers (a model proposer's validator, alive for the whole run,
    and each round's search: `WorkerPools` hands both the same processes) can call one worker
    at once. Their requests and replies shared its pipe unguarded: one thread read the other's
    reply, or the middle of it as a length (CI: `OverflowError` reading a pickle as a 2^63-byte
    header). Each call now has the worker to itself from its request to its reply."""
    import threading

    from tuner.exec import worker
    w = worker.Worker("null", 0, {}, fast_settings, str(tmp_path / "w.log"))
    pid = w.call("ping", timeout=60)
    wrong: list = []

    def pings() -> None:
        for _ in range(300):
            try:
                got = w.call("ping", timeout=60)
            except Exception as e:  # noqa: BLE001 - what the desync raised, recorded
                wrong.append(f"{type(e).__name__}: {e}")
                return
            if got != pid:
                wrong.append(got)
    try:
        threads = [threading.Thread(target=pings) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        w.kill()
    assert not wrong and w.started == 1, (wrong[:3], w.started)
