"""Hostile kernels (tests/fixtures/redteam/): each tries to win without doing the work, or to
reach outside its buffers, and each is pinned to the status and reason it must get. The honest
kernel beside them must still pass: the checks cost no false positive."""

import dataclasses
import subprocess

import pytest

from tests.conftest import FIXTURES
from tuner.codecheck import check_object
from tuner.core.ops import builtin_spec
from tuner.core.skeleton import load_skeleton
from tuner.core.values import Status
from tuner.exec.evaluate import Evaluator

REDTEAM = FIXTURES / "redteam"
ROOT = FIXTURES.parent.parent
SHAPE = "128x1024"  # large enough that skipped work shows in the times on a busy machine

C_CASES = {
    "honest": (Status.OK, ""),
    "poison_only": (Status.WRONG_RESULT, ""),
    # Right on the checks' inputs, NaN on inputs 16x larger, which torch's own softmax computes.
    "no_row_max": (Status.WRONG_RESULT, "scaled by 16"),
    # Flagged once most of its timed calls are second calls on a set; where the budget buys
    # fewer (a machine whose cache flush takes 0.1 s), its median is its full work: "not faster".
    "skip_if_done": ((Status.SUSPECT, "not faster"), "depends on the calls before it"),
    # Half the work when its output already holds its result: under 2x, so only the poison
    # before every timed call stands against it (never finds its result there: not faster).
    "half_if_done": ("not faster", ""),
    # A result cache in an uninitialised local array, and one in a freed heap block (half its
    # rows: 1.9x faster once, under the history check's 2x of the time). The host clears the
    # stacks before every call and zeroes the kernel's heap after it: the cache never hits, and
    # the kernel is timed at its work (or, in a history check on a busy machine, flagged).
    "stack_cache": ((Status.SUSPECT, Status.WRONG_RESULT, "not faster"), ""),
    "heap_cache": ((Status.SUSPECT, Status.WRONG_RESULT, "not faster"), ""),
    # Probes of those channels that answer wrong when they find what an earlier call left
    # (found before the host cleared them; a quarter of the rows kept in the heap was 1.26x
    # faster and OK, under the history factor): nothing is found, they are right. A find is a
    # wrong result wherever it happens (checks, timed calls, calls on new buffers); SUSPECT is
    # a timing verdict a busy machine can give any kernel (a late start), not a find.
    "finds_heap": ((Status.OK, Status.SUSPECT), ""),
    "finds_stack": ((Status.OK, Status.SUSPECT), ""),
    "keeps_heap": (Status.RUNTIME_ERROR, "not freed"),
    "omp_heap": (Status.COMPILE_ERROR, "memory allocators"),
    "result_cache": (Status.COMPILE_ERROR, "writable global or static data"),
    "same_buffers": (Status.COMPILE_ERROR, "writable global or static data"),
    "restore_input": (Status.RUNTIME_ERROR, "inputs were read-only"),
    "far_store": (Status.RUNTIME_ERROR, "SIGSEGV"),
    "hidden_fork": (Status.COMPILE_ERROR, "'fork'"),
    "hidden_ctor": (Status.COMPILE_ERROR, ".init_array"),
    "hidden_ifunc": (Status.COMPILE_ERROR, "an indirect function"),
    "python_api": (Status.COMPILE_ERROR, "'PyEval_GetBuiltins'"),
    "digraph_system": (Status.COMPILE_ERROR, "system"),
    # Work on after the call returns (a team left running, GOMP_parallel_start without its
    # end), during the host's untimed flush: refused by name; the host also ends a call
    # that returns inside a parallel region (tests/test_kernel_host.py).
    "background_team": (Status.COMPILE_ERROR, "'GOMP_parallel_start'"),
    # Rewrites its host's clock slot (made writable through the host's own mprotect) to report a
    # quarter of its time: 3.4x faster than the honest kernel and OK before the judge held the
    # reported end to the reply it saw and to the host's time on a core.
    "lies_about_its_end": (Status.SUSPECT, "reported its calls shorter than they were"),
}


def c_skeleton(name: str, tmp_path):
    body = (REDTEAM / f"{name}.c").read_text()
    template = tmp_path / f"{name}.c.j2"
    template.write_text("#define M {{M}}L\n#define N {{N}}L\n{% raw %}" + body + "{% endraw %}\n")
    space = tmp_path / f"{name}.yaml"
    space.write_text("language: c\nsizes: [M, N]\nparams:\n  V: [1]\n")
    return load_skeleton(template, space)


@pytest.fixture(scope="module")
def cpu_records(tmp_path_factory):
    """Every C case evaluated once by one evaluator per case (a kernel's fault stays its own)."""
    from tuner.core.settings import Settings
    tmp = tmp_path_factory.mktemp("redteam")
    # A budget for a few dozen timed calls: a kernel that skips work on buffers it has seen
    # gains only from the second call on a set between two checks, and on a busy 2-core machine
    # (each call's cache flush takes milliseconds) 0.05 s bought five calls, none of them a second.
    settings = Settings(runs_dir=str(tmp / "runs"), cache_dir=str(tmp / "cache"), bench_budget_s=0.6,
                        warmup_s=0.0, min_reps=5, max_reps=400, precision=0.0, run_timeout_s=120.0,
                        compile_timeout_s=60.0, compile_workers=1)
    out = {}
    # The honest kernel first and again last: a "not faster" case is held against the faster of
    # its two times, so that load on the machine during one honest timing does not read as the
    # other kernels' gain (a CI run timed it well above two kernels doing the same work).
    for name in (*C_CASES, "honest, again"):
        sk = c_skeleton(name.split(",")[0], tmp)
        ev = Evaluator("cpu", builtin_spec("softmax", SHAPE), sk, settings, tmp / name.replace(", ", "-"))
        try:
            ev.start()
            out[name] = ev.evaluate(sk.space.default_config())
        finally:
            ev.close()
    return out


@pytest.mark.parametrize("name", list(C_CASES))
def test_each_hostile_c_kernel_gets_its_verdict(cpu_records, name):
    status, words = C_CASES[name]
    rec = cpu_records[name]
    allowed = status if isinstance(status, tuple) else (status,)
    if "not faster" in allowed and rec.status is Status.OK:
        # Accepted only with the time of the work it does when it does it all: no gain.
        honest = min(cpu_records["honest"].seconds, cpu_records["honest, again"].seconds)
        assert rec.seconds >= 0.7 * honest, (name, rec.seconds, honest)
        return
    assert rec.status in allowed, (name, rec.status, rec.reason)
    assert words in rec.reason, (name, rec.reason)


def test_a_kernel_faster_than_the_device_allows_is_suspect(fast_settings, tmp_path):
    """The physics check: however correct, a time under the device's floor is never OK. (An
    honest kernel against a floor set at one second stands in for one that beats the device.)"""
    sk = c_skeleton("honest", tmp_path)
    ev = Evaluator("cpu", builtin_spec("softmax", "8x64"), sk, fast_settings, tmp_path / "run")
    ev.floor = lambda: (1.0, "a floor of one second, for this test")
    try:
        ev.start()
        rec = ev.evaluate(sk.space.default_config())
    finally:
        ev.close()
    assert rec.status is Status.SUSPECT, rec.reason
    assert "faster than this device can run it (a floor of one second, for this test)" in rec.reason


def test_the_floor_is_the_ops_bytes_and_flops_at_the_measured_peaks(fast_settings, tmp_path):
    from tuner.core.values import DeviceInfo
    sk = c_skeleton("honest", tmp_path)
    ev = Evaluator("cpu", builtin_spec("matmul", "256x256x256"), sk, fast_settings, tmp_path / "run")
    try:
        ev.device_info = DeviceInfo(backend="cpu", name="x", cores=1, peaks=(("copy_gbps", 10.0),
                                                                          ("fp32_gflops", 100.0)))
        seconds, why = ev.floor()
        flops = 2 * 256**3
        assert seconds == pytest.approx(flops / (2.0 * 100e9)) and "GFLOP" in why
        ev.device_info = DeviceInfo(backend="cpu", name="x", cores=1, simulated=True,
                                    peaks=(("copy_gbps", 10.0),))
        assert ev.floor() is None  # a modelled device's times are not measured
    finally:
        ev.close()


OBJECTS = {
    "syscall": ('void tuner_kernel(float *x) { __asm__ volatile ("syscall"); x[0] = 1; }', "syscall instruction"),
    "tls": ("_Thread_local float t; void tuner_kernel(float *x) { t += x[0]; x[0] = t; }", "thread-local"),
    "static": ("void tuner_kernel(float *x) { static int n; x[0] = n++; }", "writable global or static data"),
    "getenv": ('char *getenv(const char *); void tuner_kernel(float *x) { x[0] = !!getenv("HOME"); }', "'getenv'"),
    "no_entry": ("void kernel(float *x) { x[0] = 1; }", "no exported `tuner_kernel`"),
    # A syscall written as data into .text and called: objdump's listing never showed it.
    "text_data": ('__attribute__((section(".text"))) const unsigned char b[] = {0x0f, 0x05, 0xc3};\n'
                  "void tuner_kernel(float *x) { x[0] = ((int (*)(void))b)(); }", "data in an executable section"),
    # The clock through an intrinsic (no call to name): a kernel could time its own calls.
    "rdtsc": ("#include <x86intrin.h>\nvoid tuner_kernel(float *x) { x[0] = (float)__rdtsc(); }",
              "may not read the clock"),
    # A team left working after the return, declared by hand (no header names it).
    "split_team": ("void GOMP_parallel_start(void (*)(void *), void *, unsigned);\n"
                   "static void f(void *p) { ((float *)p)[0] = 1; }\n"
                   "void tuner_kernel(float *x) { GOMP_parallel_start(f, x, 2); }", "'GOMP_parallel_start'"),
    # An indirect function: the loader runs its resolver (the object's own code) when it binds it.
    "ifunc": ("static float one(void) { return 1; }\nstatic void *pick(void) { return (void *)one; }\n"
              "float chosen(void) __attribute__((ifunc(\"pick\")));\n"
              "void tuner_kernel(float *x) { x[0] = chosen(); }", "an indirect function"),
    # The clock through OpenMP's API (the vDSO: no system call for the host's filter to refuse).
    "omp_wtime": ("double omp_get_wtime(void);\nvoid tuner_kernel(float *x) { x[0] = (float)omp_get_wtime(); }",
                  "OpenMP's clock"),
    "clean": ("#include <math.h>\nvoid tuner_kernel(float *x) { x[0] = expf(x[1]); }", None),
    # What the compiler emits for OpenMP's pragmas passes: the libgomp allowlist refuses no honest kernel.
    "pragmas": ("#include <omp.h>\nvoid tuner_kernel(float *x) { float s = 0;\n"
                "#pragma omp parallel for reduction(+:s) schedule(dynamic)\n"
                "for (long i = 0; i < 64; i++) s += x[i];\n"
                "#pragma omp parallel for schedule(guided) collapse(2)\n"
                "for (long i = 0; i < 8; i++) for (long j = 0; j < 8; j++) x[i * 8 + j] += s;\n"
                "#pragma omp parallel\n{\n#pragma omp for schedule(runtime) nowait\n"
                "for (long i = 0; i < 64; i++) x[i] *= 2;\n#pragma omp barrier\n"
                "#pragma omp single\nx[0] = omp_get_num_threads();\n#pragma omp critical\nx[1] += 1;\n"
                "#pragma omp atomic\nx[2] += 1;\n#pragma omp sections\n{\n#pragma omp section\nx[3] = 1;\n}\n"
                "#pragma omp for ordered\nfor (long i = 0; i < 8; i++) {\n#pragma omp ordered\nx[i] += 1;\n}\n"
                "#pragma omp master\n{\n#pragma omp taskgroup\n{\n#pragma omp task\nx[4] = 1;\n}\n"
                "#pragma omp taskwait\n#pragma omp taskloop\nfor (long i = 0; i < 8; i++) x[i] += 1;\n}\n}\n}", None),
}


@pytest.mark.parametrize("name", list(OBJECTS))
def test_the_object_check_reads_what_was_built(name, tmp_path):
    """Sources the source check would refuse, compiled directly: the object check alone
    refuses each by what the object holds."""
    code, words = OBJECTS[name]
    (tmp_path / "k.c").write_text(code)
    subprocess.run(["cc", "-O2", "-fopenmp", "-shared", "-fPIC", str(tmp_path / "k.c"), "-o",
                    str(tmp_path / "k.so"), "-lm"], check=True, capture_output=True)
    findings = check_object(str(tmp_path / "k.so"))
    if words is None:
        assert findings == []
    else:
        assert any(words in f.why for f in findings), findings


TRITON_CASES = {
    "honest": (Status.OK, ""),
    "poison_only": (Status.WRONG_RESULT, ""),
    # Right on the checks' inputs, NaN on inputs 16x larger, which torch's own softmax computes.
    "no_row_max": (Status.WRONG_RESULT, "scaled by 16"),
    "looks_done": (Status.WRONG_RESULT, "a timed call's result was wrong"),
    "host_exp": (Status.WRONG_RESULT, "computed with torch on the host (aten.pow)"),
}


def evaluated_once(backend: str, spec, sk, settings, folder):
    """The record of the skeleton's default config, evaluated by a fresh evaluator."""
    ev = Evaluator(backend, spec, sk, settings, folder)
    try:
        ev.start()
        return ev.evaluate(sk.space.default_config())
    finally:
        ev.close()


def _understated(lie: str, folder):
    (folder / "k.yaml").write_text(f"language: triton_ascend\nsizes: [M, N]\nparams:\n  LIE: [{lie}]\n")
    return load_skeleton(REDTEAM / "understated_cost_ascend.py.j2", folder / "k.yaml")


@pytest.mark.parametrize("lie,status,why", [
    ("none", Status.OK, None),
    ("passes", Status.WRONG_RESULT, "understates the kernel's traffic"),
    ("transfers", Status.WRONG_RESULT, "understates the kernel's transfers"),
    ("serial", Status.WRONG_RESULT, "understates the kernel's traffic: program (0, 0, 0)"),
    ("hidden", Status.WRONG_RESULT, "understates the kernel's traffic: program (10, 0, 0)"),
    ("vector", Status.WRONG_RESULT, "understates the kernel's vector work: program (0, 0, 0)"),
    ("spin", Status.WRONG_RESULT, "work the simulator's model has no term for: program (0, 0, 0)"),
    # A read outside the tensors the launch passed: refused by the interpreter's bound.
    ("outside", Status.RUNTIME_ERROR, "a load outside the tensors the launch passed"),
    ("bytes", Status.COMPILE_ERROR, "less than the op's own inputs and outputs"),
    ("unique", Status.COMPILE_ERROR, "unique_bytes=48000, less than the op's own")])
def test_the_simulator_refuses_a_declared_cost_the_kernel_exceeds(fast_settings, tmp_path, lie, status, why):
    """The sim backend's time is a model of the module's ASCEND_COST: a kernel declaring less
    than it moves would be modelled faster than it is. A declaration below the op's own bytes
    is refused when compiled; the first checked launch is metered (at this size every program
    interpreted, their loads and stores counted) and held against the declaration per
    program; the honest declaration of the same kernel passes."""
    rec = evaluated_once("sim", builtin_spec("softmax", "20x3000"), _understated(lie, tmp_path), fast_settings,
                         tmp_path / "run")
    assert rec.status is status and (why is None or why in rec.reason), (rec.status, rec.reason)


def test_the_simulators_winner_is_metered_program_by_program(fast_settings, tmp_path):
    """Above the interpreted size the kernel is not run whole: a checked launch meters a sample
    of programs (first, last, two at random) and checks what they wrote, which a kernel doing
    every row in one program in the middle of its grid, or skipping that program's rows,
    escapes 19 times in 20 here. The winner's audit (Backend.memcheck) meters every program and
    checks the outputs whole, so both are refused there; a kernel whose outputs are wrong
    (or NaN) everywhere is refused at its first checked launch; the honest kernel's audit is
    clean."""
    said = {}
    for lie in ("none", "hidden", "lazy", "wrong", "nan"):
        (tmp_path / lie).mkdir()
        ev = Evaluator("sim", builtin_spec("softmax", "256x1024"), _understated(lie, tmp_path / lie), fast_settings,
                       tmp_path / lie / "run")
        try:
            ev.start()
            rec = ev.evaluate(ev.skeleton.space.default_config())
            assert rec.build.artifact, rec
            said[lie] = (rec.status, ev.memcheck(rec), rec.reason)
        finally:
            ev.close()
    assert said["none"][0] is Status.OK and said["none"][1].startswith("clean (every one of its 48 programs"), said
    assert said["hidden"][1].startswith("errors: ASCEND_COST understates the kernel's traffic: program (24, 0, 0)"), \
        said
    assert said["lazy"][1].startswith("errors: output y: 5120 of 262144 elements never written"), said
    assert said["wrong"][0] is Status.WRONG_RESULT and "elements the metered programs wrote are off" in said["wrong"][2], \
        said
    # NaN everywhere: the sampled programs' outputs were poisoned with NaN half the time, and
    # NaN written read as not written (OK); the sampled runs' poison is finite now.
    assert said["nan"][0] is Status.WRONG_RESULT and "elements the metered programs wrote are off" in said["nan"][2], \
        said


def test_the_simulator_sees_a_launch_that_computes_on_the_host(fast_settings, tmp_path):
    """The sim backend's time is the model of the kernel's declared costs: work the launch
    function did with torch on the host would be free there. Its interpreted checks run under
    the dispatch mode, as a GPU's checked launches do."""
    (tmp_path / "k.yaml").write_text("language: triton_ascend\nsizes: [M, N]\nparams:\n  V: [1]\n")
    sk = load_skeleton(REDTEAM / "host_exp_ascend.py.j2", tmp_path / "k.yaml")
    rec = evaluated_once("sim", builtin_spec("softmax", "37x1000"), sk, fast_settings, tmp_path / "run")
    assert rec.status is Status.WRONG_RESULT and "computed with torch on the host (aten.pow)" in rec.reason, \
        (rec.status, rec.reason)


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(TRITON_CASES))
def test_each_hostile_triton_kernel_gets_its_verdict(name, fast_settings, tmp_path):
    body = (REDTEAM / f"{name}.py").read_text()
    (tmp_path / "k.py.j2").write_text("{% raw %}" + body + "{% endraw %}\n")
    (tmp_path / "k.yaml").write_text("language: triton\nsizes: [M, N]\nparams:\n  V: [1]\n")
    sk = load_skeleton(tmp_path / "k.py.j2", tmp_path / "k.yaml")
    rec = evaluated_once("cuda", builtin_spec("softmax", "1024x1024"), sk, fast_settings, tmp_path / "run")
    status, words = TRITON_CASES[name]
    assert rec.status is status, (name, rec.status, rec.reason)
    assert words in rec.reason, (name, rec.reason)


@pytest.mark.cuda
@pytest.mark.parametrize("every", [2, 4])
def test_a_kernel_that_keeps_tiles_in_device_memory_between_calls_is_suspect(every, fast_settings, tmp_path):
    """tile_stash.py keeps one in `every` of a matmul's output tiles in a scratch tensor that
    the caching allocator hands back on the next call (one slot per input buffer, tagged by a
    fingerprint of its inputs): correct throughout, and faster on the buffers it was timed on
    (half kept: 1.69x, 127 against 214 us at 4096^3 bf16 on an H200, bench/lone_calls.py
    --module). The default 2x factor let half through; a 1.3x factor caught half and let one in
    four through (an H100); the cuda backend's 1.15x catches both. (With 16 slots at 8 MiB, the
    timed sets shared one slot, half its calls missed, its median was the honest time, and OK
    was the right verdict.)"""
    body = (REDTEAM / "tile_stash.py").read_text().replace("KEEP_EVERY = 2", f"KEEP_EVERY = {every}")
    (tmp_path / "k.py.j2").write_text("{% raw %}" + body + "{% endraw %}\n")
    (tmp_path / "k.yaml").write_text("language: triton\nsizes: [M, N, K]\nparams:\n  V: [1]\n")
    sk = load_skeleton(tmp_path / "k.py.j2", tmp_path / "k.yaml")
    # Timed as a search times it (the figures above): enough calls that each buffer set comes back.
    settings = dataclasses.replace(fast_settings, bench_budget_s=0.25, warmup_s=0.02, min_reps=5, max_reps=2000)
    ev = Evaluator("cuda", builtin_spec("matmul", "4096x4096x4096", "bf16"), sk, settings, tmp_path / "run")
    try:
        ev.start()
        rec = ev.evaluate(sk.space.default_config())
    finally:
        ev.close()
    assert rec.status is Status.SUSPECT, (rec.status, rec.reason)
    assert "never seen" in rec.reason and "two rounds" in rec.reason, rec.reason


@pytest.mark.cuda
def test_the_winners_memcheck_run_sees_a_store_far_from_any_buffer(fast_settings, tmp_path):
    """Guard bands see a store near a buffer; one 4 MiB past it lands, on a GPU, in memory
    nothing checks. The winner runs once under compute-sanitizer's memcheck, which sees it;
    an honest kernel comes out clean. Twice each: the first in the checker's process started
    ahead while the search ran (Backend.memcheck_ahead), the second in a fresh one."""
    import shutil
    from pathlib import Path
    if not (shutil.which("compute-sanitizer") or Path("/usr/local/cuda/bin/compute-sanitizer").is_file()):
        pytest.skip("compute-sanitizer is not installed here")
    results = {}
    for name in ("honest", "far_store"):
        body = (REDTEAM / f"{name}.py").read_text()
        (tmp_path / f"{name}.py.j2").write_text("{% raw %}" + body + "{% endraw %}\n")
        (tmp_path / f"{name}.yaml").write_text("language: triton\nsizes: [M, N]\nparams:\n  V: [1]\n")
        sk = load_skeleton(tmp_path / f"{name}.py.j2", tmp_path / f"{name}.yaml")
        ev = Evaluator("cuda", builtin_spec("softmax", "256x1024"), sk, fast_settings, tmp_path / name)
        try:
            ev.start()
            rec = ev.evaluate(sk.space.default_config())
            assert rec.build.artifact, rec
            results[name] = (rec, ev.memcheck(rec), ev.memcheck(rec))
        finally:
            ev.close()
    assert results["honest"][1:] == ("clean", "clean"), results["honest"]
    assert all(r.startswith("errors") for r in results["far_store"][1:]), results["far_store"]


def test_the_memory_checkers_input_is_the_artifact_path_and_nothing_more(tmp_path):
    """The checker started ahead reads the winner's path from a pipe that the process running
    candidates' launch code holds: a path written into it first (a clean kernel's, to be
    checked in the winner's place) makes two lines, and the checker refuses rather than check
    either (exit 3: the winner is not cleared); an empty input launches nothing."""
    import json
    import sys
    op = json.dumps(builtin_spec("softmax", "4x8").to_json())
    cmd = [sys.executable, "-m", "tuner.exec.memcheck", "cpu", "-", op]
    two = subprocess.run(cmd, input=f"{tmp_path}/clean/kernel.so\n{tmp_path}/winner/kernel.so\n",
                         capture_output=True, text=True, timeout=120)
    assert two.returncode == 3 and "held 2 lines, not one artifact path" in two.stderr, two.stderr
    none = subprocess.run(cmd, input="", capture_output=True, text=True, timeout=120)
    assert none.returncode == 0, none.stderr


def test_a_decode_attention_kernel_that_skips_the_end_of_the_cache_is_wrong(fast_settings, tmp_path):
    """The library's own C skeleton for attention_decode, edited to leave out the last 2 % of
    each sequence's cache (less work than asked, an output that still looks like an average
    of values): WRONG_RESULT, and the unedited skeleton OK on the same evaluator settings. (At
    bf16 on a GPU the same rule catches 0.5 % left out: bench/RESULTS.md.)"""
    from tuner.core.skeleton import library_skeleton
    honest = library_skeleton("attention_decode", "c")
    source = (ROOT / "kernel_templates/attention_decode/c.c.j2").read_text()
    assert "#define TK_S {{S}}L" in source
    (tmp_path / "skip.c.j2").write_text(source.replace("#define TK_S {{S}}L", "#define TK_S ({{S}}L - {{S}}L / 50)"))
    space = (ROOT / "spaces/attention_decode/c.yaml").read_text().replace("attention_decode/c.c.j2", "skip.c.j2")
    (tmp_path / "skip.yaml").write_text(space)
    hostile = load_skeleton(tmp_path / "skip.c.j2", tmp_path / "skip.yaml")
    spec = builtin_spec("attention_decode", "2x4x2x200x32", "fp32")
    for sk, want in ((hostile, Status.WRONG_RESULT), (honest, Status.OK)):
        ev = Evaluator("cpu", spec, sk, fast_settings, tmp_path / want.value)
        try:
            ev.start()
            rec = ev.evaluate(sk.space.default_config())
        finally:
            ev.close()
        assert rec.status is want, (want, rec.status, rec.reason)
