"""Every Triton skeleton of the library, without a GPU: a few configs of each (the default and one
per value of every structural choice) run through Triton's interpreter (TRITON_INTERPRET=1) on
small shapes and must match the float64 reference; and one config of each compiles ahead for
sm_90 at a realistic shape, within the H100/H200's shared memory. A broken template fails here."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from tuner.backends.cuda import CudaBackend  # noqa: E402
from tuner.core.ops import builtin_spec, load_op, render_context  # noqa: E402
from tuner.core.skeleton import library_skeleton, library_skeletons  # noqa: E402
from tuner.core.values import Status  # noqa: E402
from tuner.exec.checks import check, reference as _reference  # noqa: E402

# Small shapes with ragged edges, so that masked paths run too.
SMALL = {
    "softmax": ("37x300", ["fp32", "bf16"]),
    "rmsnorm": ("19x200", ["fp32", "bf16"]),
    "layernorm": ("19x200", ["fp32", "fp16"]),
    "add_rmsnorm": ("19x200", ["fp32", "bf16"]),
    "swiglu": ("13x300", ["fp32", "bf16"]),
    "rope": ("7x3x32", ["fp32", "bf16"]),
    "cross_entropy": ("9x1000", ["fp32", "bf16"]),
    "matmul": ("40x72x256", ["fp32", "fp16"]),  # the interpreter mishandles bf16 tl.dot
    "attention": ("1x2x96x32", ["fp16"]),
    "attention_causal": ("1x2x96x32", ["fp16"]),
    "attention_decode": ("2x8x2x300x32", ["fp32", "fp16"]),
}
# Realistic shapes for the ahead-of-time compile.
LARGE = {
    "softmax": "8192x8192", "rmsnorm": "8192x8192", "layernorm": "8192x8192",
    "add_rmsnorm": "16384x4096", "swiglu": "8192x14336", "rope": "4096x32x128",
    "cross_entropy": "4096x32000", "matmul": "4096x4096x4096", "attention": "1x8x1024x128",
    # Attention at the benchmark's 4x32x4096x128 would need its float64 reference for the output
    # shapes whenever the meta-tensor path fails; a smaller shape compiles the same kernel.
    "attention_causal": "1x8x1024x128",
    "attention_decode": "16x32x8x4097x128",
}
ROOT = Path(__file__).resolve().parent.parent
TRITON_OPS = sorted(op for op, langs in library_skeletons().items() if "triton" in langs)


def test_every_triton_skeleton_has_shapes_here():
    assert TRITON_OPS and set(TRITON_OPS) <= set(SMALL) and set(TRITON_OPS) <= set(LARGE)


def _context(backend, op):
    return {**render_context(op), **backend.render_context(op)}


def sample_configs(skeleton, context, limits, seed=0, tries=20000, extra=2):
    """The default (when valid), for each value of each structural (non-numeric) param one
    valid config that takes it, and `extra` more valid configs at random."""
    space = skeleton.space
    rng = random.Random(seed)
    picked = {}
    default = space.default_config()
    if space.check(default, context, limits) is None:
        picked[default.key] = default
    wanted = {(p.name, v) for p in space.params if not p.ordered for v in p.values}
    # Also try (without insisting: some are invalid at small shapes) each numeric param's ends.
    hoped = {(p.name, v) for p in space.params if p.ordered for v in (p.values[0], p.values[-1])}
    names = [p.name for p in space.params]
    for i in range(tries):
        if not wanted and (not hoped or i > tries // 2) and len(picked) >= extra + 1:
            break
        cfg = {p.name: rng.choice(p.values) for p in space.params}
        if wanted or hoped:
            name, value = rng.choice(sorted(wanted or hoped, key=repr))
            cfg[name] = value
        from tuner.core.values import Config
        config = Config.of(cfg)
        if space.check(config, context, limits) is None:
            took = {(n, config[n]) for n in names}
            if took & (wanted | hoped) or len(picked) < extra + 1:
                picked.setdefault(config.key, config)
            wanted -= took
            hoped -= took
    assert picked, f"{skeleton.name}: no valid config at this shape"
    return list(picked.values()), wanted


def interpret_op(op_name: str, workdir: str) -> None:
    """Run the sampled configs of one op through the interpreter; raise on the first failure.
    Runs in a child process: TRITON_INTERPRET must be set before triton is first imported."""
    shape, dtypes = SMALL[op_name]
    skeleton = library_skeleton(op_name, "triton")
    never = None  # structural choices that no dtype could take
    for dtype in dtypes:
        spec = builtin_spec(op_name, shape, dtype)
        backend = CudaBackend(0, interpret=True, op=spec.to_json())
        op = load_op(spec)
        context = _context(backend, op)
        configs, missing = sample_configs(skeleton, context, backend.limits())
        never = missing if never is None else never & missing
        for i, config in enumerate(configs):
            source = skeleton.render(config, context)
            build = backend.compile(source, spec, f"{workdir}/{dtype}-{i}/k", 60)
            assert build.status is Status.OK, (str(config), build.error)
            kernel = backend.load(build.artifact, op)
            why, _, _ = check(backend, kernel, op, 7 + i, _reference(op, 7 + i))
            assert why is None, f"{op_name} {dtype} {config}: {why}"
            print(f"ok {op_name} {dtype} {config}")
    assert not never, f"{op_name} {shape}: no valid config takes {sorted(never)}"


@pytest.mark.parametrize("op_name", TRITON_OPS)
def test_interpreter_matches_reference(op_name, tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, op_name, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.mark.slow
@pytest.mark.parametrize("op_name", TRITON_OPS)
def test_compiles_ahead_for_sm90(op_name, tmp_path):
    spec = builtin_spec(op_name, LARGE[op_name], "bf16")
    backend = CudaBackend(0, arch=90, cores=132, op=spec.to_json())
    op = load_op(spec)
    skeleton = library_skeleton(op_name, "triton")
    context = _context(backend, op)
    configs, _ = sample_configs(skeleton, context, backend.limits(), seed=1)
    build = backend.compile(skeleton.render(configs[0], context), spec, str(tmp_path / "b" / "k"), 300)
    assert build.status is Status.OK, (configs[0], build.error)
    assert build.binary_hash


@pytest.mark.cuda
def test_one_compile_worker_serves_several_ops(tmp_path, fast_settings):
    """A sweep's compile process gets each request's op with the request (not one process per op)."""
    from tuner.exec.worker import Worker
    worker = Worker("cuda", 0, {"arch": 90, "cores": 132, "cache_dir": str(tmp_path / "cache")}, fast_settings)
    try:
        for i, op_name in enumerate(["softmax", "rmsnorm", "softmax"]):
            spec = builtin_spec(op_name, ["4096x4096", "1000x3000", "512x1024"][i], "bf16")
            backend = CudaBackend(0, arch=90, cores=132, op=spec.to_json())
            skeleton = library_skeleton(op_name, "triton")
            context = _context(backend, load_op(spec))
            config = sample_configs(skeleton, context, backend.limits(), seed=1)[0][0]
            build = worker.call("compile", timeout=300, source=skeleton.render(config, context),
                                workdir=str(tmp_path / f"b{i}"), timeout_s=300, op=spec.to_json())
            assert build.status is Status.OK, (op_name, build.error)
        assert worker.started == 1
    finally:
        worker.close()


# Ragged, moderate shapes for the GPU check (bf16): masks run, references stay cheap.
GPU = {
    "softmax": "1000x3000", "rmsnorm": "1000x3000", "layernorm": "1000x3000", "add_rmsnorm": "1000x3000",
    "swiglu": "1000x3000", "rope": "1000x12x128", "cross_entropy": "500x32000",
    "matmul": "1000x1536x768", "attention": "2x4x1024x128", "attention_causal": "2x4x1024x128",
    "attention_decode": "3x32x8x1000x128",
}


@pytest.mark.cuda
@pytest.mark.parametrize("op_name", TRITON_OPS)
def test_gpu_configs_match_reference(op_name, fast_settings, tmp_path):
    """The default and one config per structural choice (and a few more), compiled in parallel
    and verified on the GPU by the Evaluator: none is wrong or crashes."""
    from multiprocessing.pool import ThreadPool

    from tuner.exec.evaluate import Evaluator
    settings = fast_settings.replace(compile_workers=8)
    ev = Evaluator("cuda", builtin_spec(op_name, GPU[op_name], "bf16"), library_skeleton(op_name, "triton"),
                   settings, tmp_path / op_name)
    try:
        ev.start()
        configs, _ = sample_configs(ev.skeleton, ev.context, ev.limits, extra=3)
        with ThreadPool(8) as pool:
            records = pool.map(ev.evaluate, configs)
        # A config may overrun the registers or shared memory (a compile error, as on any
        # backend); it must never run and be wrong or crash.
        bad = [(str(r.config), r.status.value, r.reason[:300]) for r in records
               if r.status not in (Status.OK, Status.COMPILE_ERROR)]
        assert not bad, bad
        assert any(r.status is Status.OK for r in records)
    finally:
        ev.close()


if __name__ == "__main__":
    interpret_op(sys.argv[1], sys.argv[2])


@pytest.mark.parametrize("op_name,small,wide", [
    ("softmax", {"M": 8192, "N": 8192}, {"M": 2**20, "N": 2**11}),
    ("rmsnorm", {"M": 8192, "N": 8192}, {"M": 2**20, "N": 2**11}),
    ("layernorm", {"M": 8192, "N": 8192}, {"M": 2**20, "N": 2**11}),
    ("add_rmsnorm", {"M": 8192, "N": 8192}, {"M": 2**20, "N": 2**11}),
    ("cross_entropy", {"M": 4096, "V": 32000}, {"M": 2**15, "V": 2**16}),
    ("swiglu", {"M": 8192, "N": 8192}, {"M": 2**20, "N": 2**11}),
    ("rope", {"T": 4096, "H": 32, "D": 128}, {"T": 2**19, "H": 32, "D": 128}),
])
def test_offsets_are_64_bit_exactly_when_a_tensor_reaches_2_31_elements(op_name, small, wide):
    # 32-bit index math where it cannot overflow (fewer instructions per element in a
    # memory-bound kernel); 64-bit from 2^31 elements on, where 32-bit offsets would wrap
    skeleton = library_skeleton(op_name, "triton")
    config = skeleton.space.default_config()
    for sizes, wants_64 in ((small, False), (wide, True)):
        ctx = {**sizes, "DTYPE_BYTES": 2, "dtype": "bf16", "op": op_name, "CORES": 132}
        source = skeleton.render(config, ctx)
        assert ("tl.int64" in source) is wants_64, (op_name, sizes)
