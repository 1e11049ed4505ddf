"""The cuda backend's `cuda` language: CUDA C++ launched from a checked Python module.

Without a GPU: the launch module's checks, the CUDA source and option checks, and real compiles
(NVRTC or nvcc, where one is installed) for an architecture named, with the PTX checks and each
launch checked against what was compiled. On a GPU (marked): the whole harness."""

from __future__ import annotations

import re
import textwrap

import pytest

from tuner import codecheck
from tuner.backends import cuda_source
from tuner.core.ops import builtin_spec, load_op, render_context
from tuner.core.skeleton import library_skeleton
from tuner.core.space import Config
from tuner.core.values import Status


def _has_compiler() -> bool:
    try:
        cuda_source.compiler()
        return True
    except cuda_source.CudaCompileError:
        return False


needs_compiler = pytest.mark.skipif(not _has_compiler(), reason="no CUDA C++ compiler (nvcc or libnvrtc)")

COPY = r'''
extern "C" __global__ void copy_rows(const float* __restrict__ x, float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
'''


def module(source: str = COPY, launch: str = 'cuda.launch(SOURCE, "copy_rows", (cuda.cdiv(n, 256),), (256,), x, y, n)',
           head: str = "import tuner.cuda as cuda") -> str:
    return f"{head}\n\nSOURCE = r'''{source}'''\n\n\ndef launch(x, y):\n    n = x.numel()\n    {launch}\n"


def _backend():
    from tuner.backends.cuda import CudaBackend
    return CudaBackend(0, arch=90, cores=132, language="cuda")


# ---- the launch module ---------------------------------------------------------------------

@pytest.mark.parametrize("op,shape", [("rmsnorm", "8192x8192"), ("layernorm", "8192x8192"), ("add_rmsnorm", "4096x8192"), ("softmax", "8192x8192"),
                                      ("cross_entropy", "4096x32000"), ("matmul", "16x14336x4096"),
                                      ("swiglu", "8192x14336"), ("rope", "4096x32x128"),
                                      ("attention", "4x32x4096x128"), ("attention_causal", "8x16x4096x64")])
def test_the_library_cuda_skeletons_render_clean_modules(op, shape):
    sk = library_skeleton(op, "cuda")
    o = load_op(builtin_spec(op, shape, "bf16"))
    ctx = {**render_context(o), "CORES": 132, "ARCH": 90}
    configs = [c for c in sk.space.configs() if sk.space.check(c, ctx, {"smem_bytes": 232448}) is None]
    assert len(configs) >= 8
    for c in configs[::max(1, len(configs) // 25)]:
        src = sk.render(c, ctx)
        assert codecheck.check_source("cuda", src) == []
        cu = re.search(r"SOURCE = r\"\"\"(.*?)\"\"\"", src, re.S).group(1)
        assert cuda_source.check_source(cu) == []


@pytest.mark.parametrize("head,launch,why", [
    ("from tuner.cuda import load_units", "load_units({}, None)", "from tuner.cuda import load_units"),
    ("import tuner.cuda as cuda", "cuda.load_units({}, None)", "tuner.cuda.load_units"),
    ("import tuner.cuda as cuda", "cuda._driver()", "private"),
    ("import tuner.cuda as cuda\nimport tuner", "cuda.cdiv(1, 1)", "import tuner;"),
    ("import tuner.cuda", "tuner.tune('softmax')", "tuner.tune"),
    ("import tuner.cuda as cuda\nimport ctypes", "ctypes.memmove(y.data_ptr(), x.data_ptr(), 4)", "import ctypes"),
    ("import tuner.cuda as cuda\nimport torch", "torch.cuda.synchronize()", "torch.cuda"),
    ("import tuner.cuda as cuda", "y.copy_(x)", "method call .copy_"),
])
def test_a_launch_module_reaches_nothing_but_cuda_launch(head, launch, why):
    findings = codecheck.check_source("cuda", module(head=head, launch=launch))
    assert findings and any(why in f.why for f in findings), findings


def test_the_triton_policy_refuses_a_cuda_module_and_back():
    assert any("tuner.cuda" in f.why for f in codecheck.check_source("triton", module()))
    triton_module = "import triton\n\n\ndef launch(x, y):\n    pass\n"
    assert any("import triton" in f.why for f in codecheck.check_source("cuda", triton_module))


# ---- the CUDA source and options -----------------------------------------------------------

@pytest.mark.parametrize("line,why", [
    ('#include "/etc/passwd"', "angle brackets"),
    ("#include </etc/passwd>", "only CUDA's device headers"),
    ("#include <cuda/../../../../etc/passwd>", "only CUDA's device headers"),
    ("#define H <stdio.h>\n#include H", "angle brackets"),
    ("#include_next <cuda_bf16.h>", "angle brackets"),
    ("#include <stdio.h>", "only CUDA's device headers"),
    ('#incl\\\nude "/etc/passwd"', "angle brackets"),        # joined by the preprocessor
    ('%:include "/etc/passwd"', "angle brackets"),               # the digraph of #
    ("%: include </etc/shadow>", "only CUDA's device headers"),
    # Probes of the compiling machine's files: the answer would come back in the compile error.
    ('#if __has_include("/root/.ssh/id_rsa")\n#error yes\n#endif', "__has_include"),
    ('#pragma GCC dependency "/etc/shadow"', "#pragma dependency"),
    ('_Pragma("GCC dependency \\"/etc/shadow\\"")', "_Pragma"),
])
def test_a_cuda_source_includes_only_device_headers(line, why):
    findings = cuda_source.check_source(line + "\n" + COPY)
    assert findings and why in findings[0].why


@pytest.mark.parametrize("opt", ["-o/tmp/x", "--compiler-bindir=/tmp", "-I/etc", "-Xcompiler=-fplugin=x.so",
                                 "--run", "-DX=$(id)", "-maxrregcount=64 -o /tmp/x", "--output-file=/tmp/y"])
def test_compile_options_outside_the_list_are_refused(opt):
    assert cuda_source.check_options((opt,))


def test_listed_compile_options_pass():
    assert cuda_source.check_options(("-maxrregcount=64", "--use_fast_math", "-O3", "-lineinfo",
                                      "-DTILE=128", "--ftz=true")) is None


def test_ptx_is_read_for_parameters_and_forbidden_calls():
    ptx = textwrap.dedent("""
        .extern .func (.param .b32 func_retval0) vprintf (.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
        .global .align 4 .u32 N = 5;
        .global .align 4 .u32 hits;
        .global .u32 unused = 1, second;
        .global .u32 pointed_at;
        .visible .global.u32 run_on;
        .global .u64 pointer = pointed_at;
        .visible .entry k(
            .param .u64 .ptr .global .align 1 k_param_0,
            .param .u32 k_param_1,
            .param .f32 k_param_2,
            .param .align 8 .b8 k_param_3[16]
        )
        {
            ld.global.u32 %r1, [N];
            ld.global.u32 %r2, [hits];
            st.global.u32 [hits], %r3;
            st.global.u32 [second], %r3;
            { .global.align 4 .u32 kept_too; st.global.u32 [kept_too], 1; st.global.u32 [run_on], 1; }
            { .global .align 4 .u32 kept; ld.global.u32 %r4, [kept]; @%p1 st.global.u32 [kept], %r4; }
            // .global .u32 said_only_in_a_comment; st.global.u32 [said_only_in_a_comment], 1;
        }
    """)
    assert cuda_source.ptx_entries(ptx) == {"k": ["u64", "u32", "f32", "b8[16]@8"]}
    why = cuda_source.check_ptx(ptx)
    assert any("printf" in w for w in why) and any("'hits'" in w for w in why)
    # Declared inside an inline-asm block, on one line with its use (ptxas takes it there).
    assert any("'kept'" in w for w in why)
    # The second name of a declaration; a variable whose address another's initializer holds.
    assert any("'second'" in w for w in why) and any("'pointed_at'" in w for w in why)
    assert not any("'unused'" in w or "'pointer'" in w for w in why)
    # `.global` with its type run on: `.global.u32 name;` (ptxas takes it, in a body too).
    assert any("'kept_too'" in w for w in why) and any("'run_on'" in w for w in why)
    assert not any("'N'" in w or "comment" in w or "k_param" in w for w in why)  # a constant; a comment; a parameter


_VPRINTF = ".func (.param .b32 r) vprintf (.param .b64 a, .param .b64 b);"
_CALL_IT = ".param .b64 pa; .param .b64 pb; .param .b32 rr; call.uni (rr), vprintf, (pa, pb);"


@pytest.mark.parametrize("body,why", [
    # Prototypes of a function defined elsewhere, in a kernel's body (inline PTX), whatever the
    # linkage says: ptxas takes each, and the driver links vprintf at load.
    ("{ .extern " + _VPRINTF + " " + _CALL_IT + " }", "printf"),
    ("{ " + _VPRINTF + " " + _CALL_IT + " }", "printf"),
    ("{ .weak " + _VPRINTF + " " + _CALL_IT + " }", "printf"),
    # A call through an address loaded from memory.
    ("{ .param .b32 rr; proto: .callprototype (.param .b32 _) _ (); ld.global.u64 %rd2, [%rd1]; "
     "call (rr), %rd2, (), proto; }", "an indirect call"),
    ("{ .param .b32 rr; proto: .callprototype (.param .b32 _) _ (); ld.global.u64 %rd2, [%rd1]; "
     "call(rr), %rd2, (), proto; }", "an indirect call"),  # no space after `call`: ptxas takes it
    # A function the module defines is called freely.
    ("call.uni (rr), helper, ();", None),
])
def test_a_call_reaches_only_functions_the_ptx_defines(body, why):
    ptx = textwrap.dedent("""
        .func (.param .b32 r) helper ()
        .noreturn
        {
            ret;
        }
        .visible .entry k(.param .u64 y)
        {
            .reg .b64 %rd<4>;
            BODY
            ret;
        }
    """).replace("BODY", body)
    found = cuda_source.check_ptx(ptx)
    assert (found == []) if why is None else any(why in w for w in found), found


# ---- real compiles (no GPU needed) ----------------------------------------------------------

@needs_compiler
@pytest.mark.parametrize("src,why", [
    (COPY.replace("if (i < n) y[i] = x[i];", 'if (i < n) { y[i] = x[i]; printf("%d", i); }'), "printf"),
    (COPY.replace("if (i < n) y[i] = x[i];", "float* p = (float*)malloc(4); y[i] = p[0]; free(p);"), "malloc"),
    ("__device__ float cache[1 << 20];\n" + COPY.replace("y[i] = x[i];", "{ y[i] = cache[i]; cache[i] = x[i]; }"),
     "writable __device__ variable 'cache'"),
    # The same state declared in inline PTX inside the kernel's body: the source names no variable.
    (COPY.replace("y[i] = x[i];", '{ unsigned v; asm volatile("{ .global .align 4 .u32 kept; '
                  'ld.global.u32 %0, [kept]; st.global.u32 [kept], 7; }" : "=r"(v)); y[i] = x[i] + v; }'),
     "writable __device__ variable 'kept'"),
    # printf reached from inline PTX through a prototype without `.extern`.
    (COPY.replace("y[i] = x[i];", 'asm volatile("{ .func (.param .b32 r) vprintf (.param .b64 a, .param .b64 b); '
                  '.param .b64 pa; .param .b64 pb; .param .b32 rr; st.param.b64 [pa], 0; st.param.b64 [pb], 0; '
                  'call.uni (rr), vprintf, (pa, pb); }"); y[i] = x[i];'), "printf"),
    (COPY.replace("y[i] = x[i];", "y[i] = x[i] +;"), "error"),
])
def test_device_code_that_does_what_a_timed_kernel_may_not_is_refused_when_compiled(tmp_path, src, why):
    with pytest.raises(cuda_source.CudaCompileError, match=re.escape(why)):
        cuda_source.compile_unit(src, (), 90, tmp_path, 120)


@needs_compiler
def test_an_assert_is_refused_with_what_compiles_it_out(tmp_path):
    src = "#include <assert.h>\n" + COPY.replace("if (i < n)", "assert(i >= 0);\n    if (i < n)")
    with pytest.raises(cuda_source.CudaCompileError, match="-DNDEBUG"):
        cuda_source.compile_unit(src, (), 90, tmp_path / "a", 120)
    assert cuda_source.compile_unit(src, ("-DNDEBUG",), 90, tmp_path / "b", 120)["kernels"]


@needs_compiler
@pytest.mark.parametrize("launch,why", [
    ('cuda.launch(SOURCE, "copy", (cuda.cdiv(n, 256),), (256,), x, y, n)', "does not define"),
    ('cuda.launch(SOURCE, "copy_rows", (cuda.cdiv(n, 256),), (256,), x, y)', "2 arguments"),
    ('cuda.launch(SOURCE, "copy_rows", (cuda.cdiv(n, 256),), (256,), x, y, 1.5)', "float for an integer"),
    ('cuda.launch(SOURCE, "copy_rows", (cuda.cdiv(n, 256),), (256,), x, y, x)', "a tensor (a 64-bit device pointer)"),
    ('cuda.launch(SOURCE, "copy_rows", (1,), (2048,), x, y, n)', "at most 1024 threads"),
    ('cuda.launch(SOURCE, "copy_rows", (1,), (256,), x, y, n, smem=300000)', "shared memory"),
    ('cuda.launch(SOURCE, "copy_rows", (0,), (256,), x, y, n)', "at least 1"),
    ('cuda.launch(SOURCE, "copy_rows", (1,), (256,), x, y, n, options=("-o/tmp/x",))', "not allowed"),
    ("n + 1", "launched no kernel"),
])
def test_each_launch_is_checked_against_the_compiled_kernel(tmp_path, launch, why):
    b = _backend()
    build = b.compile(module(launch=launch), builtin_spec("softmax", "64x256", "fp32"), str(tmp_path), 120)
    assert build.status is Status.COMPILE_ERROR and why in build.error, build.error


TMA_COPY = r'''
struct alignas(64) TensorMap { unsigned long long v[16]; };
extern "C" __global__ void first_box(const __grid_constant__ TensorMap m, float* __restrict__ y) {
    __shared__ alignas(128) float box[8 * 32];
    __shared__ alignas(8) unsigned long long bar;
    const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(box));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(1024));
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3}], [%4];"
                     :: "r"(d), "l"(reinterpret_cast<unsigned long long>(&m)), "r"(0), "r"(0), "r"(b) : "memory");
        unsigned done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(b) : "memory");
    }
    __syncthreads();
    y[threadIdx.x] = box[threadIdx.x];
}
'''


@needs_compiler
@pytest.mark.parametrize("launch,why", [
    ('cuda.launch(SOURCE, "first_box", (1,), (256,), cuda.tensor_map(x, (8, 32)), y)', None),
    ('cuda.launch(SOURCE, "first_box", (1,), (256,), x, y)', "a tensor for a tensor map's parameter"),
    ('cuda.launch(SOURCE, "first_box", (1,), (256,), cuda.tensor_map(x, (8, 32)), cuda.tensor_map(y, (8, 32)))',
     "a tensor map (cuda.tensor_map) for a parameter of type .u64"),
    ('cuda.launch(SOURCE, "first_box", (1,), (256,), cuda.tensor_map(x, (8, 300)), y)', "one int in 1..256"),
    ('cuda.launch(SOURCE, "first_box", (1,), (256,), cuda.tensor_map(x, (8, 32), swizzle=64), y)',
     "exceeds the swizzle span"),
    ('cuda.launch(SOURCE, "first_box", (1,), (256,), cuda.tensor_map(x, (8, 6)), y)', "a multiple of 16"),
])
def test_a_tensor_map_is_made_of_a_tensor_and_passed_only_to_a_tensor_map_parameter(tmp_path, launch, why):
    b = _backend()
    src = module(TMA_COPY, launch=launch)
    build = b.compile(src, builtin_spec("softmax", "64x256", "fp32"), str(tmp_path), 120)
    if why is None:
        assert build.status is Status.OK, build.error
    else:
        assert build.status is Status.COMPILE_ERROR and why in build.error, build.error


@needs_compiler
@pytest.mark.parametrize("op,shape,dtype", [("rmsnorm", "256x4096", "bf16"), ("rmsnorm", "64x1024", "fp32"),
                                            ("layernorm", "256x4096", "bf16"), ("add_rmsnorm", "128x2048", "fp16"), ("softmax", "64x4096", "bf16"),
                                            ("cross_entropy", "256x32000", "bf16"),
                                            ("matmul", "16x2048x1024", "bf16"),
                                            ("matmul", "5x1024x512", "fp16"),
                                            ("swiglu", "7x9", "fp16"), ("rope", "37x5x6", "bf16"),
                                            ("attention", "1x2x256x128", "bf16"), ("attention_causal", "2x1x512x64", "fp16")])
def test_library_configs_compile_for_hopper_without_a_gpu(tmp_path, op, shape, dtype):
    import json
    b = _backend()
    sk = library_skeleton(op, "cuda")
    spec = builtin_spec(op, shape, dtype)
    ctx = {**render_context(load_op(spec)), **b.render_context(load_op(spec))}
    configs = [c for c in sk.space.configs() if sk.space.check(c, ctx, b.limits()) is None]
    # Three spread over the space, and one per value of a param that changes the code's
    # instructions: the matmul's feeds, the L2-hinted loads, the half-precision exponentials,
    # attention's one or two consumer warpgroups (the second with setmaxnreg) and o's two stores.
    picks = configs[:: max(1, len(configs) // 3)][:3]
    for name, value in (("FEED", None), ("LOAD", "hint"), ("EXP", "f16x2"), ("LOAD", "ldlu"), ("FAST_EXP", True),
                        ("CONSUMERS", None), ("STORE", None), ("PERSISTENT", None), ("REDUCE", None)):
        values = sorted({c.as_dict().get(name) for c in configs} - {None}, key=str)
        picks += [next(c for c in configs if c.as_dict().get(name) == v) for v in values if value in (None, v)]
    for i, c in enumerate(picks):
        build = b.compile(sk.render(c, ctx), spec, str(tmp_path / str(i)), 120)
        assert build.status is Status.OK, (c, build.error)
        manifest = json.loads((tmp_path / str(i) / "kernel.cuda.json").read_text())
        assert manifest["arch"] == 90 and all(
            k["params"] and "regs" in k for u in manifest["units"].values() for k in u["kernels"].values())


def test_a_source_not_compiled_ahead_is_not_launched():
    from tuner import cuda
    with pytest.raises(RuntimeError, match="not compiled ahead"):
        cuda.launch("extern \"C\" __global__ void k() {}", "k", (1,), (1,))


def test_the_cuda_backend_names_its_languages():
    from tuner.backends import BackendUnavailable
    from tuner.backends.cuda import CudaBackend
    with pytest.raises(BackendUnavailable, match="triton or cuda"):
        CudaBackend(0, arch=90, language="c")
    assert CudaBackend(0, arch=90).language == "triton"


# ---- on a GPU -------------------------------------------------------------------------------

# Per op, the structural choices each given one config in the test below (a config with
# these values: the rest as the space's first valid config has them).
_ROW_NORMS = [{"G": g, "CACHE": cache} for g, cache in
              ((8, False), (32, True), (64, True), (64, False), (256, True), (256, False))]
_HINTS = [{"LOAD": "hint", "CACHE": True}, {"LOAD": "hint", "CACHE": False}]
_CUDA_ROW_PICKS = {"rmsnorm": _ROW_NORMS + _HINTS, "layernorm": _ROW_NORMS, "add_rmsnorm": _ROW_NORMS,
                   "softmax": _ROW_NORMS + _HINTS,
                   "cross_entropy": [{"G": g, "EXP": e} for g, e in ((8, "f32"), (32, "f16x2"), (64, "f32"),
                                                                     (128, "f16x2"), (256, "f32"), (256, "f16x2"))],
                   # elementwise: the tail past the last whole vector, persistent grids, each load kind
                   "swiglu": [{"PROGS_PER_SM": p, "LOAD": ld, "FAST_EXP": f} for p, ld, f in
                              ((0, "ldg", False), (1, "ldcs", True), (4, "ldlu", False), (16, "ldg", True))]
                             + [{"THREADS": 256, "UNROLL": 4, "STORE_CS": True}],
                   # tokens a block not dividing the tokens, vectors narrower than 16 bytes (D/2 = 36)
                   "rope": [{"ROWS": r, "THREADS": t, "LOAD": ld, "UNROLL": u} for r, t, ld, u in
                            ((1, 32, "ldg", 1), (8, 256, "ldcs", 2), (16, 512, "ldlu", 4), (8, 128, "ldg", 4))]}
_ROW_SHAPES = {"swiglu": "999x3077", "rope": "1001x12x72"}


@pytest.mark.cuda
@pytest.mark.parametrize("op", sorted(_CUDA_ROW_PICKS))
def test_every_choice_of_the_cuda_row_ops_is_right_on_the_gpu(op, fast_settings, tmp_path):
    """The default and one config per value of each structural param (threads per row above
    and below a warp, the row cached or read again, exponentials in fp32 or two at a time in
    half precision, each load and store kind, L2 eviction hints) and a few more, at a ragged shape (rows not a
    multiple of ROWS), verified by the Evaluator: none is wrong or crashes. The layernorm
    inputs' rows have a mean of 0.5, where a variance taken as E[x^2] - mean^2 without a shift
    would lose digits."""
    from multiprocessing.pool import ThreadPool

    from tests.test_triton_library import sample_configs
    from tuner.exec.evaluate import Evaluator
    ev = Evaluator("cuda", builtin_spec(op, _ROW_SHAPES.get(op, "1000x3072"), "bf16"), library_skeleton(op, "cuda"),
                   fast_settings.replace(compile_workers=8), tmp_path / op, options={"language": "cuda"})
    try:
        ev.start()
        configs, _ = sample_configs(ev.skeleton, ev.context, ev.limits, extra=4)
        valid = [c for c in ev.skeleton.space.configs() if ev.skeleton.space.check(c, ev.context, ev.limits) is None]
        configs += [next(c for c in valid if pick.items() <= c.as_dict().items()) for pick in _CUDA_ROW_PICKS[op]]
        with ThreadPool(8) as pool:
            records = pool.map(ev.evaluate, configs)
        bad = [(str(r.config), r.status.value, r.reason[:300]) for r in records
               if r.status not in (Status.OK, Status.COMPILE_ERROR)]
        assert not bad, bad
        assert sum(r.status is Status.OK for r in records) >= len(records) - 2
    finally:
        ev.close()


@pytest.mark.cuda
@pytest.mark.parametrize("op,shape,dtype", [("attention", "4x8x1024x128", "bf16"),
                                            ("attention_causal", "1x11x4096x128", "bf16"),
                                            ("attention_causal", "3x4x1280x64", "bf16"),
                                            ("attention_causal", "3x4x1280x64", "fp16")])
def test_every_choice_of_the_cuda_attention_is_right_on_the_gpu(fast_settings, tmp_path, op, shape, dtype):
    """Every combination of the wgmma attention's structural choices (key blocks of 64 and
    128, one or two consumer warpgroups, softmax overlapped with p v or not, the consumers'
    turns, o stored from registers or by the TMA, one block a tile or a persistent grid; the
    eager or lazy rescaling alternating over those) at two stages, and each deeper ring once,
    at head dims 64 and 128, causal and not, with more key blocks than stages (the ring wraps)
    and query blocks past the first (the causal band's masks), in bf16 and once in fp16 (the
    other mma and conversion instructions), verified by the Evaluator against torch: none is
    wrong, none crashes. The device is
    told it has 5 multiprocessors, so that a persistent grid's blocks each walk dozens of tiles
    (the ring and q's buffers wrap across tiles); 11 causal heads make two tile groups of 8
    and 3 heads."""
    from multiprocessing.pool import ThreadPool

    from tuner.exec.evaluate import Evaluator
    ev = Evaluator("cuda", builtin_spec(op, shape, dtype), library_skeleton(op, "cuda"),
                   fast_settings.replace(compile_workers=8), tmp_path / op, options={"language": "cuda", "cores": 5})
    try:
        ev.start()
        assert ev.context["CORES"] == 5
        valid = [c for c in ev.skeleton.space.configs() if ev.skeleton.space.check(c, ev.context, ev.limits) is None]
        # RESCALE (the softmax's arithmetic, not its synchronisation) alternates over the
        # combinations of the others, so that each of its values meets each of theirs.
        combos = sorted({tuple(sorted((k, v) for k, v in c.as_dict().items() if k != "RESCALE"))
                         for c in valid if c.as_dict()["STAGES"] == 2})
        configs = [Config.of({**dict(combo), "RESCALE": ("eager", "lazy")[(i + i // 2) % 2]}) for i, combo in enumerate(combos)]
        configs += [next(c for c in valid if c.as_dict()["STAGES"] == n) for n in (3, 4)]
        assert len(configs) >= 40 and all(c in valid for c in configs)
        with ThreadPool(8) as pool:
            records = pool.map(ev.evaluate, configs)
        # Every config is honest, so none may be judged SUSPECT either: before the backend's
        # least hold ahead of a lone call (`_MIN_HOLD_S`), one of 48 here read "1.6x slower on
        # buffers it had never seen" (the host's launch on new buffers, TMA descriptors encoded
        # for new addresses, outlasted the hold while the device idled).
        bad = [(str(r.config), r.status.value, r.reason) for r in records if r.status is not Status.OK]
        assert not bad, bad
    finally:
        ev.close()


@pytest.mark.cuda
@pytest.mark.parametrize("op,shape,budget", [("rmsnorm", "4096x4096", 6), ("layernorm", "4096x4096", 6), ("add_rmsnorm", "4096x4096", 6),
                                             ("softmax", "4096x4096", 6), ("cross_entropy", "1024x32000", 6),
                                             ("matmul", "16x4096x2048", 6)])
def test_cuda_cpp_kernels_tune_verify_and_win_through_the_harness(fast_settings, tmp_path, op, shape, budget):
    from tuner.run.tune import create_run, execute, with_backend_options
    sk = library_skeleton(op, "cuda")
    store = create_run(fast_settings, builtin_spec(op, shape, "bf16"), "cuda", sk, seed=0,
                       extra={"backend_options": {"language": "cuda"}})
    summary = execute(store, fast_settings, budget, make_evaluator=with_backend_options(None, {"language": "cuda"}))
    assert summary["best"] is not None, summary["failures"]
    assert summary["evaluations"] >= budget


@pytest.mark.cuda
@pytest.mark.parametrize("shape,dtype", [("16x14336x4096", "bf16"), ("5x1024x512", "fp16"), ("1x2048x1024", "bf16")])
def test_every_feed_of_the_cuda_matmul_computes_the_product_call_after_call(tmp_path, shape, dtype):
    """Configs of each feed (the per-warp cp.async ring; the TMA ring with its swizzled boxes
    and mbarriers), one per column-block width, one per split reduced in a cluster, against torch in float64 at M = 16 and M < 16
    (a's rows past M read as zeros), and the two configs a race was seen in, 24 calls each on two
    input sets: a race between a stage's readers and its next copy shows in some calls only (it
    did: whole blocks wrong in most calls at BN 32 before the proxy fence)."""
    import torch

    from tuner.backends.cuda import CudaBackend
    b = CudaBackend(0, language="cuda")
    sk = library_skeleton("matmul", "cuda")
    spec = builtin_spec("matmul", shape, dtype)
    op = load_op(spec)
    ctx = {**render_context(op), **b.render_context(op)}
    configs = [c for c in sk.space.configs() if sk.space.check(c, ctx, b.limits()) is None]
    sets = []
    for seed in (7, 8):
        xs = [b.to_device(x) for x in op.make_inputs(seed)]
        sets.append((xs, xs[0].double() @ xs[1].double()))
    # The two configs the race was seen in (86 and 7 of 100-150 calls wrong without the fence).
    raced = [Config.of({**sk.space.default_config().as_dict(), **d}) for d in (
        {"FEED": "tma", "BN": 32, "KT": 16, "WARPS": 4, "STAGES": 4, "SPLIT": 4},
        {"FEED": "tma", "BN": 16, "KT": 64, "WARPS": 4, "STAGES": 2, "UNROLL": 2, "ASMEM": False})]
    checked = []
    for feed in ("ring", "tma"):
        by_width = {}
        for c in configs:
            d = c.as_dict()
            if d["FEED"] == feed and d["STAGES"] >= 3:
                by_width.setdefault((d["BN"], d["SPLIT"] > 1), c)
        # And a cluster-reduced config at each split: the blocks of a cluster sum each other's
        # partials through distributed shared memory.
        clustered = {}
        for c in configs:
            d = c.as_dict()
            if d["FEED"] == feed and d.get("REDUCE") == "cluster":
                clustered.setdefault(d["SPLIT"], c)
        picks = list(by_width.values())[:6] + list(clustered.values()) + [c for c in raced if feed == "tma" and c in configs]
        for i, c in enumerate(picks):
            build = b.compile(sk.render(c, ctx), spec, str(tmp_path / f"{feed}{i}"), 300)
            assert build.status is Status.OK, (c, build.error)
            fn = b.load(build.artifact, op)
            for call in range(24):
                xs, want = sets[call % 2]
                out = torch.full(tuple(want.shape), float("nan"), dtype=xs[0].dtype, device=xs[0].device)
                fn(*xs, out)
                err = (out.double() - want).abs().max().item()
                assert err <= 0.02 * want.abs().max().item(), (c, call, err)
            checked.append(c.as_dict()["FEED"])
    assert checked.count("tma") >= 3 and checked.count("ring") >= 3, checked


@pytest.mark.cuda
@pytest.mark.parametrize("which", ["nvrtc", "nvcc"])
def test_a_cuda_cpp_kernel_is_tuned_exported_and_served(tmp_path, cache_dir, monkeypatch, which):
    """Each compiler end to end: a CUDA C++ rmsnorm tuned, exported and served by the runtime at
    the tuned shape and (checked, then served) at a nearer one; the entry served is the CUDA C++
    one, and its output is rmsnorm's."""
    import torch

    from tests.test_runtime import exported_runs
    from tuner.core.settings import Settings
    from tuner.run.tune import create_run, execute, with_backend_options
    from tuner.serve.runtime import Table
    monkeypatch.setenv("TUNER_CUDA_COMPILER", which)
    try:
        cuda_source.compiler()
    except cuda_source.CudaCompileError as e:
        pytest.skip(str(e))
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.01,
                        warmup_s=0.0, min_reps=3, max_reps=20)
    store = create_run(settings, builtin_spec("rmsnorm", "256x1024", "bf16"), "cuda", library_skeleton("rmsnorm", "cuda"),
                       "guided", 0, extra={"backend_options": {"language": "cuda"}})
    summary = execute(store, settings, 3, make_evaluator=with_backend_options(None, {"language": "cuda"}))
    assert summary["best"] is not None, summary["failures"]
    exported_runs(tmp_path)
    table = Table.load(tmp_path / "out" / "tuning.json", cache_dir=cache_dir)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    for rows in (256, 300):
        x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
        want = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
        got = table("rmsnorm", x, w)
        assert table.last is not None, f"{rows} rows: not served by the tuned kernel"
        assert table.skeletons[table.last.entry["skeleton"]]["language"] == "cuda"
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=2e-2)


SWIGLU = r'''
extern "C" __global__ void swiglu(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    BODY
}
'''
HONEST = "if (i < n) { const float v = a[i]; y[i] = v / (1.f + expf(-v)) * b[i]; }"
HOSTILE = {  # each a swiglu that is right but for one thing
    "honest": (HONEST, {"OK"}),
    "out of bounds": (HONEST.replace("y[i] =", "y[i + (1 << 26)] ="), {"RUNTIME_ERROR", "WRONG_RESULT"}),
    "trap": (HONEST.replace("}", "asm volatile(\"trap;\"); }"), {"RUNTIME_ERROR"}),
    "hang": ("while (n > 0) { " + HONEST + " }", {"RUN_TIMEOUT"}),
    "skips work": (HONEST.replace("i < n", "i < n / 2"), {"WRONG_RESULT"}),
}


def swiglu_module(body: str) -> str:
    return ("import tuner.cuda as cuda\n\nSOURCE = r'''" + SWIGLU.replace("BODY", body) + "'''\n\n\n"
            "def launch(a, b, y):\n    n = a.numel()\n"
            "    cuda.launch(SOURCE, \"swiglu\", (cuda.cdiv(n, 256),), (256,), a, b, y, n)\n")


@needs_compiler
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_hostile_variant_compiles_and_passes_the_launch_checks(tmp_path, name):
    """What the GPU test below runs is a kernel the compile accepts: its outcome there is the
    kernel's behaviour, not a compile error."""
    build = _backend().compile(swiglu_module(HOSTILE[name][0]), builtin_spec("swiglu", "64x256", "fp32"),
                               str(tmp_path), 120)
    assert build.status is Status.OK, build.error


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_cuda_kernels_are_records_with_reasons(fast_settings, tmp_path, name):
    """An honest swiglu passes; the same kernel faulting, trapping, hanging or skipping half its
    work is a failed record of that kind; the next config runs in a fresh worker."""
    from tuner.core.skeleton import Skeleton
    from tuner.core.space import parse_space
    from tuner.exec.evaluate import Evaluator
    body, allowed = HOSTILE[name]
    source = swiglu_module(body)
    sk = Skeleton(template=source, space=parse_space("language: cuda\nparams:\n  X: [1]\n"), language="cuda",
                  name="hostile")
    ev = Evaluator("cuda", builtin_spec("swiglu", "64x256", "fp32"), sk, fast_settings, tmp_path / "run",
                   options={"language": "cuda"})
    try:
        ev.start()
        build = ev.compile(source, "probe")
        assert build.status is Status.OK, build.error
        meas = ev.measure(build)
        assert meas.status.name in allowed, (meas.status, meas.detail)
    finally:
        ev.close()


def test_a_model_writing_cuda_cpp_is_told_the_cuda_contract_and_shown_a_cuda_skeleton():
    from tuner.core.values import DeviceInfo
    from tuner.llm.prompt import PromptKit
    spec = builtin_spec("rmsnorm", "4096x4096", "bf16")
    op = load_op(spec)
    dev = DeviceInfo("cuda", "NVIDIA H200", 132, limits=(("smem_bytes", 232448.0),))
    k = PromptKit(spec, op, "cuda", "cuda", dev, {**render_context(op), "CORES": 132, "ARCH": 90},
                  {"smem_bytes": 232448.0}, 1e-4)
    rules = k.backend_rules()
    assert "cuda.launch(" in rules and "def launch(x, w, y)" in rules and "@triton.jit" not in rules
    text = k.propose()[1]["content"]
    assert "language: cuda" in text and "import tuner.cuda as cuda" in text


def test_a_sweep_entry_names_its_language_and_gets_a_task_of_its_own(tmp_path):
    from tuner.sweeps.plan import SweepError, load_plan
    f = tmp_path / "s.yaml"
    f.write_text("name: lang\nbackend: cpu\ndtypes: [fp32]\nops:\n  rmsnorm: {shapes: [64x256]}\n"
                 "  rmsnorm_c: {op: rmsnorm, language: c, shapes: [64x256]}\n")
    keys = [t.key for t in load_plan(f).tasks]
    assert keys == ["rmsnorm-64x256-fp32-cpu", "rmsnorm-64x256-fp32-cpu-c"]
    f.write_text("name: lang\nbackend: cpu\nops:\n  rmsnorm: {language: cuda, shapes: [64x256]}\n")
    with pytest.raises(SweepError, match="the cpu backend compiles c"):
        load_plan(f)
    # A list: a task per language (a language listed twice is one task); each one checked.
    f.write_text("name: lang\nbackend: cpu\ndtypes: [fp32]\nops:\n"
                 "  rmsnorm: {language: [c, c], shapes: [64x256, 64x512]}\n")
    assert [t.key for t in load_plan(f).tasks] == ["rmsnorm-64x256-fp32-cpu-c", "rmsnorm-64x512-fp32-cpu-c"]
    f.write_text("name: lang\nbackend: cpu\nops:\n  rmsnorm: {language: [c, cuda], shapes: [64x256]}\n")
    with pytest.raises(SweepError, match="language 'cuda': the cpu backend compiles c"):
        load_plan(f)
    f.write_text("name: lang\nbackend: cpu\nops:\n  rmsnorm: {language: [], shapes: [64x256]}\n")
    with pytest.raises(SweepError, match="names no language; give one or more of c"):
        load_plan(f)
    f.write_text("name: lang\nbackend: cpu\nops:\n  rmsnorm: {language: {c: 1}, shapes: [64x256]}\n")
    with pytest.raises(SweepError, match=r"language must be a list, e\.g\. \[triton, cuda\]"):
        load_plan(f)


def test_a_sweep_entry_with_a_cuda_template_compiles_in_its_language(tmp_path):
    """A template is in its space's language: on the cuda backend a CUDA C++ template's task
    is a `cuda` task without saying so (as `tuner tune --template` does), and a `language:`
    that names another is refused, where before every config would have failed to compile."""
    from tuner.sweeps.plan import SweepError, load_plan
    (tmp_path / "k.py.j2").write_text("import tuner.cuda as cuda\n")
    (tmp_path / "k.yaml").write_text("language: cuda\nsizes: [M, N]\nparams:\n  V: [1]\n")
    f = tmp_path / "s.yaml"
    f.write_text("name: t\nbackend: cuda\ndtypes: [bf16]\nops:\n"
                 "  mine: {op: rmsnorm, shapes: [64x256], template: k.py.j2, space: k.yaml}\n")
    with pytest.raises(SweepError) as e:  # this machine has no GPU: the task is named in the refusal
        load_plan(f)
    assert "rmsnorm-64x256-bf16-cuda-cuda: no CUDA device" in str(e.value), str(e.value)
    for given in ("triton", "[triton, cuda]"):
        f.write_text("name: t\nbackend: cuda\ndtypes: [bf16]\nops:\n"
                     f"  mine: {{op: rmsnorm, shapes: [64x256], template: k.py.j2, space: k.yaml, language: {given}}}\n")
        with pytest.raises(SweepError, match="the template is cuda .its space's `language:`., not triton"):
            load_plan(f)

