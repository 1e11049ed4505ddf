"""The npu backend without an NPU: everything that does not need the device.

Option mapping, launch-option checks, the UB-overflow parser (and how feedback groups it), core
counts and grid planning, the spaces' resource formulas against the compiler's limits, the
toolchain probes, and every triton_ascend skeleton through Triton's interpreter on CPU tensors
(Ascend options stripped). What needs an NPU (events, do_bench_npu, bishengir) is marked `npu`
in the conformance suite and never ran here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.backends import BackendUnavailable, default_backend, get_backend
from tuner.backends.ascend_model import Cost, check_capacity, ub_required_bytes
from tuner.backends.ascend_source import (
    ASCEND_OPTIONS,
    MULTIBUFFER_DEFAULT,
    bishengir_flags,
    check_launch_options,
    check_option,
    compile_excerpt,
    core_counts,
    launches,
    parse_ub_overflow,
    plan_grid,
    read_cost,
    strip_options,
)
from tuner.backends.npu import NpuBackend, cann_version
from tuner.backends.sim import SimBackend
from tuner.codecheck import require_clean
from tuner.core.ops import builtin_spec, load_op, render_context
from tuner.core.skeleton import library_skeleton, library_skeletons
from tuner.core.values import Build, Config, Measurement, Record, Status
from tuner.llm.feedback import build_feedback

ROOT = Path(__file__).resolve().parent.parent
ASCEND_OPS = sorted(op for op, langs in library_skeletons().items() if "triton_ascend" in langs)
REQUIRED = {"softmax", "rmsnorm", "layernorm", "add_rmsnorm", "swiglu", "rope", "matmul"}
# The FAQ's and issue #302's text of the bishengir error.
UB_ERROR = ("MLIRCompilationError: [ConvertLinalgRToBinary] encounters error:\n"
            "error: Failed to run BishengHIR pipeline\n"
            "loc(...): error: ub overflow, requires 3072256 bits while 1572864 bits available! (possible "
            "reason: tiling basic block is too large or block number is more than what user expect due to "
            "multi-buffer feature is enabled and some ops need extra local buffer. )")


def test_the_library_has_every_required_ascend_skeleton():
    assert REQUIRED <= set(ASCEND_OPS)


# ---- compile options --------------------------------------------------------------------------

def test_options_and_their_bishengir_flags():
    assert MULTIBUFFER_DEFAULT is True
    for name in ("multibuffer", "unit_flag", "sync_solver", "tile_mix_vector_loop", "tile_mix_cube_loop",
                 "enable_auto_bind_sub_block"):
        assert name in ASCEND_OPTIONS
    cv = {n for n, o in ASCEND_OPTIONS.items() if o.cv_only}
    assert {"unit_flag", "sync_solver", "tile_mix_vector_loop", "tile_mix_cube_loop",
            "enable_auto_bind_sub_block"} <= cv and "multibuffer" not in cv
    assert "num_warps" not in ASCEND_OPTIONS  # ignored on A2/A3, never tuned
    flags = bishengir_flags({"multibuffer": False, "sync_solver": True, "unit_flag": True,
                             "tile_mix_cube_loop": 4, "enable_ubuf_saving": None})
    assert "--enable-auto-multi-buffer=false" in flags
    assert {"--enable-hivm-graph-sync-solver=true", "--enable-hivm-cross-core-gss=true"} <= set(flags)
    assert "--enable-hivm-unit-flag-sync=true" in flags
    assert not any("ubuf" in f for f in flags)  # None: not forwarded


@pytest.mark.parametrize("name, value, ok", [
    ("multibuffer", True, True), ("multibuffer", 1, False), ("tile_mix_cube_loop", 4, True),
    ("tile_mix_cube_loop", 3, False), ("tile_mix_vector_loop", True, False),
    ("limit_auto_multi_buffer_of_local_buffer", "no-l0c", True), ("compile_mode", "simt", False),
    ("unit_flag", None, True), ("bogus", True, False)])
def test_check_option(name, value, ok):
    assert (check_option(name, value) is None) is ok


KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n), mask=o < n)


def launch(x, y):
    k[(4,)](x, y, x.numel(), BLOCK=64, {opts})
'''


def test_launch_options_are_checked_like_triton_ascend_parse_options():
    assert check_launch_options(KERNEL.format(opts="multibuffer=False, unit_flag=True")) is None
    assert check_launch_options(KERNEL.format(opts="num_warps=4")) is None  # accepted, ignored
    why = check_launch_options(KERNEL.format(opts="multibufer=True"))
    assert why.startswith("KeyError: 'multibufer'")
    assert "tile_mix_cube_loop" in check_launch_options(KERNEL.format(opts="tile_mix_cube_loop=3"))
    la = launches(KERNEL.format(opts="multibuffer=False"))
    assert la[0].kernel == "k" and la[0].grid == (4,) and la[0].ascend_options == {"multibuffer": False}


def test_strip_options_keeps_kernel_arguments():
    src = KERNEL.format(opts="multibuffer=True, sync_solver=False")
    out = strip_options(src)
    require_clean("triton_ascend", out)
    la = launches(out)[0]
    assert dict(la.kwargs) == {"BLOCK": 64}


# ---- the UB overflow ----------------------------------------------------------------------------

def test_ub_overflow_is_parsed_into_required_and_available():
    ub = parse_ub_overflow(UB_ERROR)
    assert (ub.required_bits, ub.available_bits) == (3072256, 1572864)
    assert ub.available_bytes == 196608  # 192 KB of UB per vector core on A2/A3
    assert parse_ub_overflow("error: something else") is None
    excerpt = compile_excerpt(UB_ERROR)
    assert excerpt.splitlines()[0].startswith("ub overflow, requires 3072256 bits while 1572864 bits available")
    assert parse_ub_overflow(excerpt) == ub


def test_feedback_groups_ub_overflows_with_required_vs_available():
    def rec(i, bits):
        err = compile_excerpt(UB_ERROR.replace("3072256", str(bits)))
        return Record("op", "h", Config.of({"BLOCK": i}), Build(Status.COMPILE_ERROR, error=err),
                      Measurement(Status.COMPILE_ERROR), "Ascend910B2")
    space = library_skeleton("swiglu", "triton_ascend").space
    fb = build_feedback([rec(1, 2359296), rec(2, 4718592)], space)
    assert len(fb.failures) == 1
    g = fb.failures[0]
    assert g["count"] == 2 and g["resource"] == "UB bits"
    assert g["required"] == [2359296, 4718592] and g["available"] == 1572864


# ---- cores and grids -----------------------------------------------------------------------------

def test_core_counts_from_driver_properties():
    assert core_counts({"num_aicore": 24, "num_vectorcore": 48, "max_shared_mem": 1}) == (24, 48)
    assert core_counts({"num_aicore": 20}) == (20, 40)  # triton-ascend: num_vectorcore = 2 x num_aicore
    with pytest.raises(BackendUnavailable, match="num_aicore"):
        core_counts({"multiprocessor_count": 132})


@pytest.mark.parametrize("tiles, cores, ppc, programs, waves, idle", [
    (1000, 48, 1, 48, 1, 0), (1000, 48, 0.5, 24, 1, 24), (1000, 48, 0.25, 12, 1, 36), (1000, 48, 2, 96, 2, 0),
    (10, 48, 1, 10, 1, 38), (10**6, 40, 4096, 65535, 1639, 0), (5, 40, 0.01, 1, 1, 39)])
def test_plan_grid(tiles, cores, ppc, programs, waves, idle):
    g = plan_grid(tiles, cores, ppc)
    assert (g.programs, g.waves, g.idle_cores) == (programs, waves, idle)
    assert g.tiles_per_program == -(-tiles // programs)


SHAPES = {"softmax": "4096x3000", "rmsnorm": "2000x5120", "layernorm": "1000x3000", "add_rmsnorm": "3072x4096",
          "swiglu": "1000x11008", "rope": "1024x32x128", "matmul": "1000x1536x768"}


def _configs(skeleton, n=60, seed=0):
    import random
    rng = random.Random(seed)
    out = [skeleton.space.default_config()]
    for _ in range(n):
        out.append(Config.of({p.name: rng.choice(p.values) for p in skeleton.space.params}))
    return out


@pytest.mark.parametrize("op_name", ASCEND_OPS)
def test_rendered_grid_is_the_planned_grid_and_the_resource_formulas_match_the_model(op_name):
    """For valid and invalid configs alike: the launch grid equals plan_grid over the right cores,
    ASCEND_COST's programs equal it too, and the space's UB (and L1/L0) formulas equal what the
    simulator's compile check computes, so the pre-compile filter and the 'compiler' agree."""
    spec = builtin_spec(op_name, SHAPES[op_name], "bf16")
    sim = SimBackend(0, chip="910B4", op=spec.to_json(), verify="reference")
    skeleton = library_skeleton(op_name, "triton_ascend")
    op = load_op(spec)
    ctx = {**render_context(op), **sim.render_context(op)}
    checked = 0
    for config in _configs(skeleton):
        if any(r.startswith("constraint") for r in [skeleton.space.check(config, ctx, {}) or ""]):
            continue
        res = skeleton.space.evaluate_resources(config, ctx)
        source = skeleton.render(config, ctx)
        (la,) = launches(source)
        cost = Cost.of(read_cost(source))
        cores = ctx["AIC"] if op_name == "matmul" else ctx["CORES"]
        assert la.grid == (plan_grid(int(res["tiles"]), cores, config["PROGS_PER_CORE"]).programs,)
        assert cost.programs == la.grid[0] == res["programs"] and cost.tiles == res["tiles"]
        mb = la.ascend_options.get("multibuffer", MULTIBUFFER_DEFAULT)
        assert mb == config["multibuffer"]
        assert ub_required_bytes(cost, sim.profile, mb) == pytest.approx(res["ub_bytes"]), config
        if op_name == "matmul":
            for r in ("l1_bytes", "l0a_bytes", "l0b_bytes"):
                assert (2 if mb else 1) * getattr(cost, r) == res[r]
            assert cost.l0c_bytes == res["l0c_bytes"]
        over = res["ub_bytes"] > sim.limits()["ub_bytes"]
        why = check_capacity(cost, sim.profile, mb)
        assert (why is not None and "ub overflow" in why) == over
        checked += 1
    assert checked >= 10


def test_limits_are_the_compilers():
    b = NpuBackend(0, interpret=True, chip="910B3")
    assert b.limits()["ub_bytes"] * 8 == 1572864  # the "bits available" of the compiler's error
    assert b.limits()["l1_bytes"] == 512 * 1024 and b.limits()["l0c_bytes"] == 128 * 1024
    ctx = b.render_context(None)
    assert (ctx["AIC"], ctx["CORES"], ctx["AIV"]) == (20, 40, 40)


# ---- availability and toolchain ----------------------------------------------------------------

def test_without_torch_npu_the_backend_says_what_to_install():
    pytest.importorskip("triton")
    try:
        import torch_npu  # noqa: F401
        pytest.skip("torch_npu is installed here")
    except ImportError:
        pass
    with pytest.raises(BackendUnavailable, match="torch_npu.*--backend sim"):
        get_backend("npu")
    assert default_backend() != "npu"


def test_cann_version_from_the_install(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    if not Path("/usr/local/Ascend").exists():
        assert cann_version() == "?"
    (tmp_path / "aarch64-linux").mkdir()
    (tmp_path / "aarch64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100R001C25\narch=aarch64\n")
    assert cann_version() == "8.5.0"


def test_interpret_mode_device_info_is_labelled():
    info = NpuBackend(0, interpret=True, chip="910B2").device_info()
    assert info.simulated and "interpreter" in info.name.lower() and info.cores == 48
    assert dict(info.toolchain)["soc"] == "Ascend910B2"


# ---- every skeleton through the interpreter --------------------------------------------------------

TINY = {"softmax": ("37x300", ["bf16"]), "rmsnorm": ("19x200", ["bf16"]), "layernorm": ("19x200", ["fp16"]),
        "add_rmsnorm": ("19x200", ["bf16"]), "swiglu": ("13x300", ["fp32"]), "rope": ("7x3x24", ["bf16"]),
        "matmul": ("40x72x200", ["fp16", "fp32"])}


def interpret_all(workdir: str) -> None:
    """Each triton_ascend skeleton: the default (when valid) and one config per value of every
    non-numeric param (multibuffer, LOOPED, ONLINE, unit_flag ...), compiled by the npu backend in
    interpret mode (options checked, then stripped) and checked against the reference.
    Runs in a child process: TRITON_INTERPRET must be set before triton is imported."""
    from tests.test_triton_library import sample_configs
    from tuner.exec.checks import check, reference as _reference
    for op_name in ASCEND_OPS:
        shape, dtypes = TINY[op_name]
        skeleton = library_skeleton(op_name, "triton_ascend")
        for dtype in dtypes:
            spec = builtin_spec(op_name, shape, dtype)
            backend = NpuBackend(0, interpret=True, chip="910B4", op=spec.to_json())
            op = load_op(spec)
            ctx = {**render_context(op), **backend.render_context(op)}
            configs, missing = sample_configs(skeleton, ctx, backend.limits(), extra=0, tries=3000)
            assert not missing, f"{op_name}: no valid config takes {missing}"
            for i, config in enumerate(configs):
                build = backend.compile(skeleton.render(config, ctx), spec, f"{workdir}/{op_name}-{dtype}-{i}/k", 60)
                assert build.status is Status.OK, (op_name, str(config), build.error)
                assert "multibuffer" not in Path(build.artifact).read_text()
                kernel = backend.load(build.artifact, op)
                why, _, _ = check(backend, kernel, op, 11 + i, _reference(op, 11 + i))
                assert why is None, f"{op_name} {dtype} {config}: {why}"
                print(f"ok {op_name} {dtype} {config}")


def test_every_ascend_skeleton_runs_correctly_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ran = [ln for ln in proc.stdout.splitlines() if ln.startswith("ok ")]
    assert {ln.split()[1] for ln in ran} == set(ASCEND_OPS)
    assert any("multibuffer=False" in ln for ln in ran) and any("unit_flag=True" in ln for ln in ran)


def test_artifacts_keep_what_an_npu_would_compile(tmp_path):
    spec = builtin_spec("swiglu", "13x300", "fp32")
    b = NpuBackend(0, interpret=True, op=spec.to_json())
    sk = library_skeleton("swiglu", "triton_ascend")
    op = load_op(spec)
    source = sk.render(sk.space.default_config(), {**render_context(op), **b.render_context(op)})
    build = b.compile(source, spec, str(tmp_path / "k"), 10)
    assert build.status is Status.OK
    assert (tmp_path / "k" / "kernel.ascend.py").read_text() == source
    bad = b.compile(source.replace("multibuffer=", "multibufer="), spec, str(tmp_path / "k2"), 10)
    assert bad.status is Status.COMPILE_ERROR and "KeyError" in bad.error
    assert json.loads(json.dumps(build.to_json()))["status"] == "OK"


if __name__ == "__main__":
    interpret_all(sys.argv[1])


def test_npu_ceilings_are_measured_once_per_process_and_the_highest_is_kept(tmp_path, monkeypatch):
    """As on a GPU: a ceiling measured while the NPU was shared must not stay for ever (no NPU
    needed: the measurement is stood in for)."""
    import json

    from tuner.backends import base, npu
    rates = iter([{"copy_gbps": 900.0, "fp16_gflops": 300000.0}, {"copy_gbps": 1500.0, "fp16_gflops": 280000.0}])
    calls = []
    monkeypatch.setattr(npu, "measure_peaks", lambda backend: calls.append(1) or next(rates))
    monkeypatch.setattr(base, "_MEASURED", {})
    first = npu._cached_peaks("910B3|48", str(tmp_path), None)
    assert npu._cached_peaks("910B3|48", str(tmp_path), None) == first and len(calls) == 1
    monkeypatch.setattr(base, "_MEASURED", {})  # a new process
    assert npu._cached_peaks("910B3|48", str(tmp_path), None) == {"copy_gbps": 1500.0, "fp16_gflops": 300000.0}
    saved = json.loads((tmp_path / "npu_peaks.json").read_text())["910B3|48"]
    assert saved == {"copy_gbps": 1500.0, "fp16_gflops": 300000.0} and len(calls) == 2


def test_options_are_those_the_release_accepts():
    """Names read from each release's NPUOptions: 3.2.0 (PyPI) rejects the newer names, 3.3+
    dropped enable_linearize, and no release takes maxnreg."""
    from tuner.backends.ascend_source import accepted_options, release_key
    assert release_key("3.2.0") == "3.2.0" and release_key("3.4.1+gitabc") == "3.3"
    assert release_key("3.5.0") == "3.5" and release_key("3.7.0.dev1") == "3.5"
    assert check_option("enable_ubuf_saving", True, "3.2.0").startswith("NPU compile option 'enable_ubuf_saving' "
                                                                         "is not accepted by triton-ascend 3.2.0")
    assert check_option("enable_ubuf_saving", True, "3.5") is None
    assert check_option("enable_linearize", True, "3.2.0") is None
    assert check_option("enable_linearize", True, "3.4.0") is not None
    for name in ("auto_blockify_size", "enable_drop_unit_dims", "enable_flatten", "enable_auto_vectorize_v2",
                 "disable_size_align_for_cast"):
        assert name not in accepted_options("3.2.0") and name in accepted_options("main")
    why = check_launch_options(KERNEL.format(opts="maxnreg=64"))
    assert why is not None and "maxnreg" in why
    why = check_launch_options(KERNEL.format(opts="enable_flatten=True"), "3.2.0")
    assert "not accepted by triton-ascend 3.2.0" in why


def test_cann_version_is_the_public_one_not_the_build_number(tmp_path, monkeypatch):
    from tuner.backends.npu import parse_cann_version
    assert parse_cann_version("runtime_running_version=[7.6.0.1.220:8.0.0]\n"
                              "toolkit_installed_version=[7.6.0.1.220:8.0.0]\n") == "8.0.0"
    assert parse_cann_version("version=8.3.RC1\n") == "8.3.RC1"
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    (tmp_path / "version.cfg").write_text("# version: 1.0\ntoolkit_installed_version=[7.6.0.1.220:8.0.0]\n")
    if not Path("/usr/local/Ascend").exists():
        assert cann_version() == "8.0.0"


@pytest.mark.parametrize("soc, profile", [
    ("Ascend910B2", "910B2"), ("Ascend910B2C", "910B2"), ("Ascend910B4-1", "910B4"), ("Ascend910B3", "910B3"),
    ("Ascend910_9391", "910_93"), ("Ascend910_9362", "910_93"), ("Ascend910_9382", "910_93"),
    ("Ascend310P3", "310P3")])
def test_every_soc_name_maps_to_its_layout(soc, profile):
    from tuner.backends.chips import profile_for_soc
    assert profile_for_soc(soc)[0].name == profile


def test_an_unknown_soc_is_refused_with_what_to_pass():
    from tuner.backends.chips import ChipError, profile_for_soc
    with pytest.raises(ChipError, match=r"no chip profile for the SoC 'Ascend950PR'.*--chip.*platform_config/Ascend950PR.ini"):
        profile_for_soc("Ascend950PR")


def test_fp32_matmul_is_a_mixed_kernel_as_the_adapter_marks_it():
    """triton-ascend's adapter gives an fp32 tl.dot kernel mix_mode "mix", like bf16: the
    template's cost says so, its UB holds the accumulator and the output tile, and the CV
    options are passed."""
    from tuner.backends.ascend_source import read_cost
    from tuner.core.ops import builtin_spec, load_op, render_context
    from tuner.core.skeleton import library_skeleton
    sk = library_skeleton("matmul", "triton_ascend")
    be = NpuBackend(0, interpret=True, chip="910B2")
    for dtype in ("fp32", "bf16"):
        op = load_op(builtin_spec("matmul", "512x512x512", dtype))
        ctx = {**render_context(op), **be.render_context(op)}
        src = sk.render(sk.space.default_config(), ctx)
        cost = read_cost(src)
        assert cost["kind"] == "mix" and cost["ub_bytes"] > 0, dtype
        assert "sync_solver=" in src
