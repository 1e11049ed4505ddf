"""The cuda backend: the rendered-module contract (no GPU needed), and on a GPU (marked cuda)
the compile-ahead cache hit, an end-to-end tuning run, and the library on realistic shapes."""

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.backends.cuda import CudaBackend
from tuner.codecheck import Forbidden, require_clean
from tuner.core.ops import builtin_spec
from tuner.core.values import Status

SPEC = builtin_spec("softmax", "8x64")  # what the compiles below are for

GOOD = '''
import math
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

SCALE = 2.0


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)


def launch(x, y):
    n = x.numel()
    ws = torch.empty((n,), dtype=torch.float32, device=x.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    k[grid](x.view(-1), y, n, BLOCK=min(1024, triton.next_power_of_2(n)), num_warps=4)
'''


def test_a_plain_module_passes():
    require_clean("triton", GOOD)


@pytest.mark.parametrize("change, words", [
    (("import math", "import os"), "import os"),
    (("import math", "import torch.nn.functional as F"), "import torch.nn.functional"),
    (("import math", "from torch import softmax"), "from torch import softmax"),
    (("    n = x.numel()", "    n = x.numel()\n    y.copy_(x * 2)"), ".copy_()"),
    (("    n = x.numel()", "    n = torch.softmax(x, -1)"), "torch.softmax"),
    (("    n = x.numel()", "    n = x.sum()"), ".sum()"),
    (("    n = x.numel()", "    n = x @ x"), "`@`"),
    (("    n = x.numel()", "    y[:] = x"), "subscript"),
    (("    n = x.numel()", "    y += 1"), "augmented"),
    (("    n = x.numel()", "    n = eval('1')"), "'eval'"),
    (("    n = x.numel()", "    n = open('/etc/passwd')"), "'open'"),
    (("    n = x.numel()", "    n = x.__class__"), "__class__"),
    (("    n = x.numel()", "    n = torch.cuda.synchronize()"), "torch.cuda"),
    (("    n = x.numel()", "    n = triton.runtime.driver"), "triton.runtime"),
    (("    n = x.numel()", "    n = {'f': x.sum}['f']()"), "call of"),
    (("SCALE = 2.0", "SCALE = print('imported')"), "module-level"),
    (("SCALE = 2.0", "x = torch.ones(3)"), "module-level"),
    (("def launch(x, y):", "def run(x, y):"), "no `def launch"),
    (("@triton.jit", "@staticmethod"), "decorator"),
    (("def launch(x, y):", "def launch(x, y=open('f')):"), "non-constant default"),
    (("def launch(x, y):", "def launch(x, y: open('f')):"), "annotations"),
    (("    n = x.numel()", "    global SCALE"), "global"),
    # A name the call rules trust (this module's function, an import) bound to something else:
    # `k(...)`/`k[grid](...)`/`tl(...)` would call whatever it now holds, past the method list.
    (("    n = x.numel()", "    k = x.untyped_storage\n    n = k()"), "'k' is bound again"),
    (("    n = x.numel()", "    k = {0: x.add_}\n    n = k[0](1)"), "'k' is bound again"),
    (("    n = x.numel()", "    n = [tl() for tl in [x.untyped_storage]]"), "'tl' is bound again"),
    (("    n = x.numel()", "    n = (lambda launch: launch())(x.untyped_storage)"), "'launch' is bound again"),
    (("    n = x.numel()", "    for math in [x.untyped_storage]:\n        n = math()"), "'math' is bound again"),
    (("def launch(x, y):", "def launch(x, k):"), "'k' is bound again"),
    (("    n = x.numel()", "    from triton import jit as k\n    n = x.numel()"), "'k' is bound again"),
    (("    n = x.numel()", "    def k():\n        pass\n    n = 1"), "'k' is bound again"),
    (("    n = x.numel()", "    match x.untyped_storage:\n        case k:\n            n = k()"), "match"),
    (("    n = x.numel()", "    try:\n        n = 1\n    except* ValueError:\n        n = 2"), "try/except*"),
    # The JIT's state tells the first (checked) launch from the timed ones; a key= calls what it gets.
    (("    n = x.numel()", "    n = len(k.cache.get(0, {}))"), "k.cache"),
    (("    n = x.numel()", "    n = max([x], key=y.copy_)"), "key= argument"),
    (("    n = x.numel()", "    print(x, file=y)"), "file= argument"),
    # Under Triton's interpreter a tensor's handle is a numpy array on the host.
    (("    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
      "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    h = offs.handle"), ".handle: what stands behind"),
])
def test_forbidden_modules_are_rejected(change, words):
    old, new = change
    assert old in GOOD
    with pytest.raises(Forbidden) as e:
        require_clean("triton", GOOD.replace(old, new))
    assert str(e.value).startswith("forbidden:") and words in str(e.value), str(e.value)


def test_a_kernel_that_writes_a_file_under_the_interpreter_is_refused_and_never_runs(tmp_path):
    """Under Triton's interpreter (interpret mode; the sim backend's verification) a kernel's body
    runs as Python and a tensor's handle holds a numpy array: `.handle.data.tofile(path)` wrote
    a file from inside a kernel that passed the checks."""
    marker = tmp_path / "written"
    source = GOOD.replace("    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                          "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
                          f"    offs.handle.data.tofile({str(marker)!r})")
    backend = CudaBackend(0, interpret=True)
    build = backend.compile(source, SPEC, str(tmp_path / "b" / "k"), 30)
    assert build.status is Status.COMPILE_ERROR and "stands behind a Triton tensor" in build.error
    assert not marker.exists()


def test_a_forbidden_module_is_a_compile_error_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    source = GOOD.replace("SCALE = 2.0", f"SCALE = open({str(marker)!r}, 'w')")
    build = CudaBackend(0, interpret=True).compile(source, SPEC, str(tmp_path / "b" / "k"), 30)
    assert build.status is Status.COMPILE_ERROR and build.error.startswith("forbidden:")
    assert not marker.exists()
    garbage = CudaBackend(0, interpret=True).compile("def launch(:", SPEC, str(tmp_path / "c" / "k"), 30)
    assert garbage.status is Status.COMPILE_ERROR and "SyntaxError" in garbage.error


# ---- on a GPU --------------------------------------------------------------------------

def _cubins(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for p in cache.rglob("*.cubin")}


@pytest.mark.cuda
def test_the_benchmark_worker_reuses_the_compile_pools_cubins(fast_settings, tmp_path):
    """Compiled in a compile worker (no GPU context), launched in the benchmark worker: the
    launch must find every cubin in the run's Triton cache and compile nothing itself."""
    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import library_skeleton
    from tuner.exec.evaluate import Evaluator
    ev = Evaluator("cuda", builtin_spec("softmax", "1024x4096", "bf16"), library_skeleton("softmax", "triton"),
                   fast_settings, tmp_path / "run")
    try:
        ev.start()
        config = next(c for c in ev.skeleton.space.configs() if ev.check(c) is None)
        source = ev.skeleton.render(config, ev.context)
        build = ev.compile(source, "probe")
        assert build.status is Status.OK, build.error
        cache = Path(build.artifact).parent.parent / "triton_cache"
        before = _cubins(cache)
        assert before, "the compile worker wrote no cubin"
        t0 = time.monotonic()
        meas = ev.measure(build)
        assert meas.status is Status.OK, meas.detail
        assert _cubins(cache) == before, "the benchmark worker compiled again"
        assert time.monotonic() - t0 < 30
    finally:
        ev.close()


@pytest.mark.cuda
def test_a_second_run_launches_with_the_first_runs_launcher(fast_settings, tmp_path):
    """Triton's per-signature launcher (a C build at a kernel's first launch) is built once per
    machine, not once per run: the second run's cache gets it from the shared folder."""
    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import library_skeleton
    from tuner.exec.evaluate import Evaluator
    spec, skeleton = builtin_spec("softmax", "1024x4096", "bf16"), library_skeleton("softmax", "triton")
    caches = []
    for run, n in (("run1", 2), ("run2", 1)):
        ev = Evaluator("cuda", spec, skeleton, fast_settings, tmp_path / run)
        try:
            ev.start()
            configs = [c for c in ev.skeleton.space.configs() if ev.check(c) is None][:n]
            for i, config in enumerate(configs):
                build = ev.compile(ev.skeleton.render(config, ev.context), f"c{i}")
                assert build.status is Status.OK, build.error
                assert ev.measure(build).status is Status.OK
                caches.append(Path(build.artifact).parent.parent / "triton_cache")
        finally:
            ev.close()
    shared = Path(fast_settings.cache_dir) / "triton_launchers"
    launchers = {p.name for p in shared.iterdir()}
    assert launchers, "the first run's launcher was not kept"
    assert launchers <= {p.name for p in caches[-1].iterdir()}


@pytest.mark.cuda
def test_tune_softmax_end_to_end(fast_settings):
    from tuner.core.ops import builtin_spec
    from tuner.core.skeleton import library_skeleton
    from tuner.run.tune import create_run, execute
    settings = fast_settings.replace(bench_budget_s=0.05, max_reps=200, compile_workers=8)
    store = create_run(settings, builtin_spec("softmax", "4096x4096", "bf16"), "cuda",
                       library_skeleton("softmax", "triton"), seed=1)
    summary = execute(store, settings, budget=16)
    assert summary["best"] is not None, json.dumps(summary["failures"])
    assert summary["device"]["peaks"]["copy_gbps"] > 100
    assert summary["best"]["speedup_vs_reference"] > 1.0
    assert (store.path / "best" / "kernel.py").is_file()


def test_gpu_ceilings_are_measured_once_per_process_and_the_highest_is_kept(tmp_path, monkeypatch):
    """A ceiling measured while the GPU was shared is too low; a later process measures again
    and the cache keeps the highest figure (no GPU needed: the measurement is stood in for)."""
    from tuner.backends import cuda
    rates = iter([{"copy_gbps": 3000.0, "bf16_gflops": 700000.0},   # measured under load
                  {"copy_gbps": 4200.0, "bf16_gflops": 650000.0}])  # a later, quieter process
    calls = []
    monkeypatch.setattr(cuda, "measure_peaks", lambda backend: calls.append(1) or next(rates))
    from tuner.backends import base
    monkeypatch.setattr(base, "_MEASURED", {})
    first = cuda._cached_peaks("H200|132|580", str(tmp_path), None)
    assert first == {"copy_gbps": 3000.0, "bf16_gflops": 700000.0}
    assert cuda._cached_peaks("H200|132|580", str(tmp_path), None) == first and len(calls) == 1
    monkeypatch.setattr(base, "_MEASURED", {})  # a new process
    assert cuda._cached_peaks("H200|132|580", str(tmp_path), None) == {"copy_gbps": 4200.0, "bf16_gflops": 700000.0}
    assert len(calls) == 2
    saved = json.loads((tmp_path / "cuda_peaks.json").read_text())["H200|132|580"]
    assert saved == {"copy_gbps": 4200.0, "bf16_gflops": 700000.0}


def test_warm_up_compiles_a_kernel_for_the_target_and_leaves_the_cache_setting_alone(monkeypatch):
    """A compile worker's warm-up runs one real compile (Triton's back end set up before the
    first candidate arrives); compile-only, so it needs no GPU, and it leaves no cache
    setting of its own behind."""
    pytest.importorskip("triton")
    from tuner.backends.cuda import CudaBackend
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    kernels = CudaBackend(0, arch=90)._warm_compile()
    assert kernels and kernels[0].asm.get("cubin")
    import os
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else"


_PTX_PROBE = """
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    BODY
    tl.store(y_ptr + offs, x)


def launch(x, y):
    k[(x.shape[0],)](x, y, N=x.shape[1])
"""


@pytest.mark.parametrize("body,why", [
    ('tl.device_print("x", x)', "device-side printf"),
    # A variable declared in inline PTX, which the Python source never names: state kept
    # from one launch to the next (ptxas accepts a `.global` declaration in a kernel's body).
    ('x = x + tl.inline_asm_elementwise("{ .global .align 4 .u32 kept; ld.global.u32 $0, [kept]; '
     'st.global.u32 [kept], 7; }", "=r", [], dtype=tl.int32, is_pure=False, pack=1).to(tl.float32)',
     "writable __device__ variable 'kept'"),
    ('x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)',
     None),
])
def test_triton_kernels_ptx_is_read_as_a_cuda_units_is(body, why, tmp_path):
    """What Triton compiled is checked by meaning like CUDA C++'s PTX: compile-only for
    sm_90, no GPU needed. Inline PTX that keeps nothing passes."""
    pytest.importorskip("triton")
    spec = builtin_spec("softmax", "64x256", "fp32")
    build = CudaBackend(0, arch=90, cores=132, op=spec.to_json()).compile(
        _PTX_PROBE.replace("BODY", body), spec, str(tmp_path / "k"), 300)
    if why is None:
        assert build.status is Status.OK, build.error
    else:
        assert build.status is Status.COMPILE_ERROR and why in build.error, (build.status, build.error)


def test_launchers_built_by_one_run_are_found_by_the_next(tmp_path):
    from tuner.backends.cuda import _share_launchers
    shared = tmp_path / "shared"
    run1, run2 = tmp_path / "run1" / "triton_cache", tmp_path / "run2" / "triton_cache"
    for name, files in {"kernelA": ["k.cubin", "k.json"], "launch1": ["__triton_launcher.so"],
                        "being_written": []}.items():
        (run1 / name).mkdir(parents=True)
        for f in files:
            (run1 / name / f).write_text(name)
    run2.mkdir(parents=True)
    seen: dict = {}
    _share_launchers(run1, shared, seen.setdefault(str(run1), set()))
    assert sorted(p.name for p in shared.iterdir()) == ["launch1"]  # a launcher, not a kernel
    # The folder still being written is looked at again: it turns out to hold a launcher.
    (run1 / "being_written" / "__triton_launcher.so").write_text("late")
    _share_launchers(run1, shared, seen[str(run1)])
    assert sorted(p.name for p in shared.iterdir()) == ["being_written", "launch1"]
    # Another run (the same Worker) gets both, under the names Triton looks them up by.
    _share_launchers(run2, shared, seen.setdefault(str(run2), set()))
    assert sorted(p.name for p in run2.iterdir()) == ["being_written", "launch1"]
    assert (run2 / "launch1" / "__triton_launcher.so").read_text() == "launch1"
    # A run's own folder of that name is left alone.
    run3 = tmp_path / "run3"
    (run3 / "launch1").mkdir(parents=True)
    (run3 / "launch1" / "__triton_launcher.so").write_text("its own")
    _share_launchers(run3, shared, set())
    assert (run3 / "launch1" / "__triton_launcher.so").read_text() == "its own"
    assert not [p for p in run2.iterdir() if p.name.startswith(".")]  # no copies left half-done


def test_compile_workers_are_told_the_arch_and_never_ask_the_device(monkeypatch):
    """The parent tells the compile workers the architecture and the shared-memory limit, so
    none of them initializes CUDA (one per core at a run's start; a Ray node may have no GPU)."""
    import types

    import torch
    props = types.SimpleNamespace(major=9, minor=0, shared_memory_per_block_optin=232448,
                                  multi_processor_count=132, name="H200", L2_cache_size=2**25)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=0: props)
    parent = CudaBackend(0)
    assert parent.compile_options() == {"arch": 90, "smem_bytes": 232448.0}

    def no_device(*a, **k):
        raise AssertionError("a compile worker asked the device")
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_device)
    worker_side = CudaBackend(0, **parent.compile_options())
    assert worker_side._arch() == 90 and worker_side.limits() == {"smem_bytes": 232448.0}
    assert CudaBackend(0, interpret=True).compile_options() == {}


# A row softmax whose store is masked or not: unmasked, each row's block (BLOCK = 64 > 40)
# writes 24 elements past its row, and the last row's past the end of the output.
STRAY_STORE = '''
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0) * n
    x = tl.load(x_ptr + row + offs, mask=offs < n, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    if MASKED:
        tl.store(y_ptr + row + offs, e / tl.sum(e, 0), mask=offs < n)
    else:
        tl.store(y_ptr + row + offs, e / tl.sum(e, 0))


def launch(x, y):
    k[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), MASKED=MASKED)
'''


def stray_store_verdicts(workdir: str, interpret: bool) -> dict[bool, str | None]:
    """What the check says of the masked and the unmasked kernel."""
    from tuner.core.ops import builtin_spec, load_op
    from tuner.exec.checks import check, reference as _reference
    spec = builtin_spec("softmax", "3x40", "fp32")
    backend = CudaBackend(0, interpret=interpret, op=spec.to_json())
    op = load_op(spec)
    verdicts = {}
    for masked in (True, False):
        build = backend.compile(f"MASKED = {masked}\n" + STRAY_STORE, spec, f"{workdir}/{masked}/k", 120)
        assert build.status is Status.OK, build.error
        ref = _reference(op, 7, backend.data_device())
        why, _, _ = check(backend, backend.load(build.artifact, op), op, 7, ref)
        verdicts[masked] = why
    return verdicts


def test_an_unmasked_triton_store_past_the_end_is_a_wrong_result_in_the_interpreter(tmp_path):
    """The guard band around every output catches a Triton tail store without a mask, which
    on a GPU lands in whatever the allocator put next (a silent pass, or a later crash)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    code = ("import sys; from tests.test_cuda_backend import stray_store_verdicts; "
            "print(repr(stray_store_verdicts(sys.argv[1], True)))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert verdicts[True] is None
    assert verdicts[False] == "the kernel wrote past the end of output y (as far as 24 element(s) beyond it)"


@pytest.mark.cuda
def test_an_unmasked_triton_store_past_the_end_is_a_wrong_result_on_the_gpu(tmp_path):
    verdicts = stray_store_verdicts(str(tmp_path), False)
    assert verdicts[True] is None
    assert verdicts[False] == "the kernel wrote past the end of output y (as far as 24 element(s) beyond it)"


def test_the_cache_flush_before_each_timed_call_reads_the_buffer_and_writes_nothing(monkeypatch):
    """The flush ahead of every timed call (a batch's and a lone one's) must leave the cache
    holding clean lines: a memset left it full of dirty ones, and the timed kernel then paid
    for writing back tens of MiB that were not its own (bench/RESULTS.md). Here on a host tensor, with
    a device module of events that only record: the buffer is read once a call and never
    written."""
    import torch

    from tuner.backends import triton_device

    class Recording:
        def __init__(self, enable_timing=True):
            pass

        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.001

    class Device:
        Event = Recording

        @staticmethod
        def current_stream(device=None):
            return None

    reads = []
    real = triton_device.evict
    monkeypatch.setattr(triton_device, "evict", lambda buf: reads.append(buf) or real(buf))
    b = CudaBackend(0)
    monkeypatch.setattr(b, "_module", lambda: Device)
    b._flush_buf = torch.full((1 << 16,), 7, dtype=torch.int32)
    calls = []
    b.time_calls(lambda: calls.append(1), 3)
    b.time_call(lambda: calls.append(1))
    assert len(calls) == 4 and len(reads) == 4 and all(r is b._flush_buf for r in reads)
    assert bool((b._flush_buf == 7).all()), "the flush wrote into its buffer: the cache is left dirty"
