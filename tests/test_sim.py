"""The Ascend simulator: chip profiles, the CANN ini parser, the compile checks, and the shapes
the model must have to rank configs plausibly. The conformance suite runs it through the
Evaluator (verification in the interpreter, faults as records)."""

import math
import os
import re

import pytest

from tuner.backends.chips import ChipError, available, load_profile, parse_ini
from tuner.backends.ascend_source import parse_ub_overflow
from tuner.backends.ascend_model import COST_KEYS, Cost, Estimate, estimate
from tuner.backends.sim import SimBackend, model_config, model_space
from tuner.core.ops import builtin_spec, load_op, render_context
from tuner.core.skeleton import library_skeleton
from tuner.core.values import Config, Status

CHIPS = {"910B1", "910B2", "910B3", "910B4", "910_93", "310P3"}


# ---- profiles ---------------------------------------------------------------------------------

def test_every_chip_has_a_profile_with_its_sources():
    assert CHIPS <= set(available())
    for name in CHIPS:
        p = load_profile(name)
        assert p.name == name and p.soc.startswith("Ascend") and p.source
        prov = dict(p.provenance)
        for field in ("cube_cores", "vector_cores", "clock_mhz", "ub_bytes", "hbm_gbps", "transfers"):
            assert field in prov, (name, field)
        for path in ("gm_to_ub", "ub_to_gm", "gm_to_l1", "l0c_to_gm"):
            assert p.transfer_s(path, 64 * 1024) > 0
    b2, b4, p3 = load_profile("910B2"), load_profile("910B4"), load_profile("310P3")
    assert (b2.cube_cores, b2.vector_cores, b2.ub_bytes) == (24, 48, 196608)
    assert b4.hbm_gbps < b2.hbm_gbps and b4.clock_mhz < b2.clock_mhz and b4.l2_bytes < b2.l2_bytes
    assert p3.coupled and not p3.triton_ascend and p3.ub_bytes > b2.ub_bytes
    assert load_profile("Ascend910B3").name == "910B3" and load_profile("ascend910_9382").name == "910_93"
    with pytest.raises(ChipError, match="910B4"):
        load_profile("910C")


def test_transfers_pay_latency_then_bandwidth():
    p = load_profile("910B1")
    sizes = [256, 1024, 4096, 16384, 65536, 262144]
    times = [p.transfer_s("gm_to_ub", s) for s in sizes]
    rates = [s / t for s, t in zip(sizes, times)]
    assert all(a < b for a, b in zip(times, times[1:]))
    assert all(a < b for a, b in zip(rates, rates[1:-1]))  # bigger transfers amortise the latency
    assert 100e-9 < p.latency_s("gm_to_ub") < 150e-9  # msKPP: 1 KB takes ~134 ns on a 910B1
    assert p.transfer_s("gm_to_ub", 1024) == pytest.approx(1024 / (7.3 * 2**30), rel=1e-6)
    assert rates[-1] == pytest.approx(78 * 2**30, rel=0.05)  # saturates at ~78 GiB/s
    slow = load_profile("910B4")  # same cycles, lower clock
    assert slow.transfer_s("gm_to_ub", 4096) == pytest.approx(p.transfer_s("gm_to_ub", 4096) * 1850 / 1500)


INI = """\
[version]
SoC_version=Ascend910B9
Short_SoC_version=Ascend910B
AIC_version=AIC-C-220
[SoCInfo]
ai_core_cnt=22
cube_core_cnt=22
vector_core_cnt=44
ai_cpu_cnt=6
memory_type=
memory_size=68719476736
l2_type=0
l2_size=167772160
[AICoreSpec]
cube_freq=1650
cube_m_size=16
cube_n_size=16
cube_k_size=16
l0_a_size=65536
l0_b_size=65536
l0_c_size=131072
l1_size=524288
ub_size=196608
ubblock_size=32
ubbank_size=4096
[AICoreMemoryRates]
ddr_rate=32
ddr_read_rate=32
l2_rate=110
l2_read_rate=110
l2_write_rate=86
l1_to_l0_a_rate=512
l1_to_l0_b_rate=256
ub_to_l2_rate=64
[VectorCoreSpec]
vec_freq=1650
[DtypeMKN]
Default=16,16,16
Int8=16,32,16
"""


def test_cann_platform_config_ini_becomes_a_profile(tmp_path):
    path = tmp_path / "Ascend910B9.ini"
    path.write_text(INI)
    p = load_profile(str(path))
    assert (p.name, p.soc) == ("910B9", "Ascend910B9")
    assert (p.cube_cores, p.vector_cores, p.clock_mhz) == (22, 44, 1650)
    assert (p.l2_bytes, p.ub_bytes, p.l1_bytes, p.l0c_bytes) == (167772160, 196608, 524288, 131072)
    assert p.l1_to_l0a_bytes_per_cycle == 512
    assert p.hbm_gbps == pytest.approx(32 * 22 * 1.65)  # ddr_rate x cores x clock
    assert p.cube_rate("fp16") == 8192
    prov = dict(p.provenance)
    assert prov["cube_cores"].startswith("INI") and prov["hbm_gbps"].startswith("DER")
    assert prov["transfers"].startswith("TOOL")  # the ini has no curves: the base profile's
    assert "base 910B1" in p.source
    # An ini for a known SoC fills its gaps from that chip.
    known = parse_ini("[version]\nSoC_version=Ascend910B4\n[AICoreSpec]\ncube_freq=1400\n", "b4.ini")
    assert (known.clock_mhz, known.hbm_gbps, known.vector_cores) == (1400, 960, 40)
    sim = SimBackend(0, chip=str(path))
    assert sim.device_info().name == "Ascend910B9" and sim.limits()["ub_bytes"] == 196608
    with pytest.raises(ChipError, match="not a number"):
        parse_ini(INI.replace("cube_freq=1650", "cube_freq=fast"), "bad.ini")
    with pytest.raises(ChipError, match="not a CANN platform_config"):
        parse_ini("[other]\nx=1\n", "other.ini")


# The figures of CANN 8.1.RC1's platform_config/Ascend910B3.ini and Ascend310P3.ini (the fields the
# profiles read; the rest of each file left out).
INI_910B3 = """[version]
SoC_version=Ascend910B3
[SoCInfo]
ai_core_cnt=20
cube_core_cnt=20
vector_core_cnt=40
memory_size=68719476736
l2_size=201326592
[AICoreSpec]
cube_freq=1800
cube_m_size=16
cube_n_size=16
cube_k_size=16
l0_a_size=65536
l0_b_size=65536
l0_c_size=131072
l1_size=524288
ub_size=196608
ubblock_size=32
[AICoreMemoryRates]
ddr_rate=32
l1_to_l0_a_rate=512
l1_to_l0_b_rate=256
[DtypeMKN]
Default=16,16,16
"""
INI_310P3 = """[version]
SoC_version=Ascend310P3
[SoCInfo]
ai_core_cnt=8
vector_core_cnt=7
memory_size=24000000000
l2_size=16777216
[AICoreSpec]
cube_freq=1060
l1_size=1048576
l0_c_size=262144
ub_size=262144
[AICoreMemoryRates]
ddr_rate=17
[VectorCoreSpec]
vec_freq=1000
[VectorCoreMemoryRates]
ddr_rate=9
"""


@pytest.mark.parametrize("chip,ini", [("910B3", INI_910B3), ("310P3", INI_310P3)])
def test_a_builtin_profile_is_what_its_cann_ini_says(chip, ini):
    """A run that reads the installed CANN's ini and one that uses the built-in profile model the
    same chip: every field the ini has, and the bandwidth derived from its rates."""
    from_ini, builtin = parse_ini(ini, f"{chip}.ini"), load_profile(chip)
    for field in ("cube_cores", "vector_cores", "clock_mhz", "ub_bytes", "l1_bytes", "l0a_bytes",
                  "l0b_bytes", "l0c_bytes", "l2_bytes", "hbm_bytes", "l1_to_l0a_bytes_per_cycle",
                  "l1_to_l0b_bytes_per_cycle", "cube_flops_per_cycle"):
        assert getattr(from_ini, field) == getattr(builtin, field), field
    assert from_ini.hbm_gbps == pytest.approx(builtin.hbm_gbps)
    assert dict(builtin.provenance)["hbm_gbps"].startswith("DER from INI")


# ---- compile checks ---------------------------------------------------------------------------

def _ctx(op_name, shape, dtype, chip="910B2"):
    spec = builtin_spec(op_name, shape, dtype)
    sim = SimBackend(0, chip=chip, op=spec.to_json(), verify="reference")
    op = load_op(spec)
    return sim, library_skeleton(op_name, "triton_ascend"), {**render_context(op), **sim.render_context(op)}


def test_compile_fails_like_the_compiler_on_ub_overflow(tmp_path):
    sim, sk, ctx = _ctx("swiglu", "8192x8192", "bf16")
    spec = builtin_spec("swiglu", "8192x8192", "bf16")
    cfg = Config.of({"BLOCK": 8192, "PROGS_PER_CORE": 1, "multibuffer": True})
    res = sk.space.evaluate_resources(cfg, ctx)
    assert "ub_bytes" in (sk.space.check(cfg, ctx, sim.limits()) or "")  # never reaches a compiler
    build = sim.compile(sk.render(cfg, ctx), spec, str(tmp_path / "a"), 10)  # ... unless forced
    assert build.status is Status.COMPILE_ERROR
    ub = parse_ub_overflow(build.error)
    assert ub.required_bits == res["ub_bytes"] * 8 and ub.available_bits == 1572864
    single = sim.compile(sk.render(cfg.__class__.of({**cfg.as_dict(), "multibuffer": False}), ctx), spec,
                         str(tmp_path / "b"), 10)
    assert single.status is Status.OK  # multibuffer doubled the buffers past UB


def test_compile_checks_the_description(tmp_path):
    sim, sk, ctx = _ctx("swiglu", "1024x1024", "fp32")
    spec = builtin_spec("swiglu", "1024x1024", "fp32")
    src = sk.render(sk.space.default_config(), ctx)
    assert sim.compile(src, spec, str(tmp_path / "ok"), 10).status is Status.OK
    cases = {"no ASCEND_COST": src.replace("ASCEND_COST", "OTHER_NAME"),
             "unknown key": src.replace('("tiles"', '("tilez"'),
             "programs=": re.sub(r'\("programs", (\d+)\)', lambda m: f'("programs", {int(m.group(1)) + 1})', src),
             "must be a literal": src.replace('("programs", ', '("programs", 1 + '),
             "KeyError": src.replace("multibuffer=", "multi_buffer=")}
    for words, bad in cases.items():
        b = sim.compile(bad, spec, str(tmp_path / words.replace(" ", "_")), 10)
        assert b.status is Status.COMPILE_ERROR and words in b.error, (words, b.error)
    assert set(COST_KEYS) >= {"kind", "programs", "tiles", "ub_bytes", "unique_bytes"}


def test_matmul_capacity_checks_l1_and_l0(tmp_path):
    sim, sk, ctx = _ctx("matmul", "4096x4096x4096", "fp16")
    spec = builtin_spec("matmul", "4096x4096x4096", "fp16")
    cfg = Config.of({**sk.space.default_config().as_dict(), "BK": 128})  # L0B: 128 x 256 x 2 x 2 > 64 KB
    assert "l0b_bytes" in sk.space.check(cfg, ctx, sim.limits())
    build = sim.compile(sk.render(cfg, ctx), spec, str(tmp_path / "m"), 10)
    assert build.status is Status.COMPILE_ERROR and "L0B overflow" in build.error


def test_device_info_is_labelled_simulated():
    info = SimBackend(0, chip="910B4").device_info()
    tools = dict(info.toolchain)
    assert info.simulated and info.name == "Ascend910B4" and info.cores == 40
    assert tools["model"].startswith("analytical") and "roofline" in tools["reference"]
    assert dict(info.peaks)["copy_gbps"] == 960


# ---- the model's shape ----------------------------------------------------------------------------

def _t(sim, sk, ctx, **cfg) -> Estimate:
    e = model_config(sim, sk, Config.of({**sk.space.default_config().as_dict(), **cfg}), ctx)
    assert isinstance(e, Estimate), e
    return e


def test_bigger_tiles_amortise_transfer_latency_until_ub_overflows():
    sim, sk, ctx = _ctx("swiglu", "8192x8192", "bf16")
    times = []
    for block in (256, 512, 1024, 2048, 4096):
        times.append(_t(sim, sk, ctx, BLOCK=block, PROGS_PER_CORE=1, multibuffer=True).seconds)
    assert all(a > b for a, b in zip(times, times[1:])), times
    assert times[0] > 3 * times[-1]
    over = model_config(sim, sk, Config.of({"BLOCK": 8192, "PROGS_PER_CORE": 1, "multibuffer": True}), ctx)
    assert isinstance(over, str) and "ub_bytes" in over


def _cost(**kw):
    base = {"kind": "vector", "programs": 48, "tiles": 48 * 64, "step_load": ((32768.0, 1.0),),
            "step_store": ((32768.0, 1.0),), "ub_bytes": 65536, "tail_bytes": 32768}
    return Cost.of({**base, **kw})


def test_double_buffering_pays_most_when_transfer_and_compute_balance():
    p = load_profile("910B2")

    def gain(vector_ops):
        c = _cost(step_vector=vector_ops)
        single = estimate(c, p, {"multibuffer": False}).seconds
        double = estimate(c, p, {"multibuffer": True})
        return single / double.seconds, double

    # Sweep the compute per step from far below the transfers' time to far above it.
    sweep = [int(2000 * 2 ** (i / 2)) for i in range(17)]  # 2k .. 512k element-ops
    gains = {ops: gain(ops)[0] for ops in sweep}
    balanced = max(gains, key=gains.get)
    _, e = gain(balanced)
    assert e.overlapped and 0.4 < e.step_compute_s / (e.step_in_s + e.step_out_s) < 2.5, e
    assert gains[balanced] > 1.5
    assert gains[sweep[0]] < gains[balanced] - 0.3 and gains[sweep[-1]] < gains[balanced] - 0.3, gains


def test_double_buffering_in_a_library_skeleton():
    sim, sk, ctx = _ctx("softmax", "8192x2048", "bf16")
    on = _t(sim, sk, ctx, ONLINE=False, BLOCK_N=2048, ROWS=2, multibuffer=True)
    off = _t(sim, sk, ctx, ONLINE=False, BLOCK_N=2048, ROWS=2, multibuffer=False)
    assert on.seconds < 0.8 * off.seconds


def test_fewer_programs_than_cores_waste_the_chip():
    for op_name, shape, cfg in (("softmax", "8192x4096", dict(ONLINE=False, BLOCK_N=4096, ROWS=1)),
                                ("rmsnorm", "8192x4096", dict(LOOPED=False, BLOCK_N=4096, ROWS=1)),
                                ("swiglu", "8192x8192", dict(BLOCK=4096))):
        sim, sk, ctx = _ctx(op_name, shape, "bf16")
        t = {ppc: _t(sim, sk, ctx, PROGS_PER_CORE=ppc, multibuffer=True, **cfg) for ppc in (0.25, 0.5, 1)}
        assert t[0.25].active_cores == 12 and t[1].active_cores == 48
        assert t[0.25].seconds > 1.5 * t[1].seconds and t[0.5].seconds > 1.1 * t[1].seconds, (op_name, t)


def test_a_second_round_of_programs_does_not_pay():
    sim, sk, ctx = _ctx("softmax", "8192x4096", "bf16")
    one = _t(sim, sk, ctx, ONLINE=False, BLOCK_N=4096, ROWS=1, PROGS_PER_CORE=1)
    two = _t(sim, sk, ctx, ONLINE=False, BLOCK_N=4096, ROWS=1, PROGS_PER_CORE=2)
    assert two.rounds == 2 and two.seconds >= one.seconds


@pytest.mark.parametrize("op_name, shape, dtype", [("softmax", "4096x4096", "bf16"), ("rmsnorm", "8192x4096", "bf16"),
                                                    ("swiglu", "4096x8192", "fp16"), ("add_rmsnorm", "4096x4096", "fp32")])
def test_910b4_is_slower_than_910b2_on_memory_bound_ops(op_name, shape, dtype):
    sk = library_skeleton(op_name, "triton_ascend")
    import random
    rng = random.Random(1)
    configs = [sk.space.default_config()] + [Config.of({p.name: rng.choice(p.values) for p in sk.space.params})
                                             for _ in range(60)]
    best = {}
    for chip in ("910B2", "910B4"):
        land = dict((c.key, e) for c, e in model_space(op_name, shape, dtype, chip, configs=configs))
        ok = {k: e.seconds for k, e in land.items() if isinstance(e, Estimate)}
        assert ok
        best[chip] = (min(ok.values()), ok)
    assert best["910B4"][0] > 1.3 * best["910B2"][0]
    common = set(best["910B2"][1]) & set(best["910B4"][1])
    assert all(best["910B4"][1][k] > best["910B2"][1][k] for k in common)


def test_matmul_rides_the_cube_and_its_options_matter():
    sim, sk, ctx = _ctx("matmul", "4096x4096x4096", "fp16")
    base = _t(sim, sk, ctx)
    flops = 2 * 4096**3
    peak = 8192 * 24 * 1.8e9
    assert 0.3 < flops / base.seconds / peak < 1.0  # a plausible share of the cube's peak
    small = _t(sim, sk, ctx, BM=32, BN=32, BK=32)
    assert small.seconds > 2 * base.seconds
    off = _t(sim, sk, ctx, multibuffer=False)
    assert off.seconds > base.seconds
    flag = _t(sim, sk, ctx, unit_flag=True)
    assert flag.seconds < base.seconds  # the L0C write-out hides behind the next mmad
    shallow = _ctx("matmul", "4096x4096x256", "fp16")  # short K: the vector epilogue matters
    split = _t(*shallow, tile_mix_cube_loop=2, tile_mix_vector_loop=2)
    serial = _t(*shallow)
    assert split.seconds < serial.seconds


def test_estimates_are_deterministic_and_finite():
    sim, sk, ctx = _ctx("rope", "1024x32x128", "bf16")
    a, b = _t(sim, sk, ctx), _t(sim, sk, ctx)
    assert a == b and math.isfinite(a.seconds) and a.seconds > a.launch_s > 0
    assert a.gm_bytes >= load_op(builtin_spec("rope", "1024x32x128", "bf16")).bytes * 0.99


_METERED = '''
import sys, torch, triton, triton.language as tl
from tuner.backends.sim_meter import audit, meter

@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, REPEAT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for _ in tl.range(0, REPEAT):
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, x * 2, mask=offs < n)

def launch(x, y, repeat):
    scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64, REPEAT=repeat)

x, y = torch.randn(1000), torch.zeros(1000)
t = meter(lambda: launch(x, y, 1), [], programs=None)
print(sorted((i[0], p.load_bytes, p.stores, p.vector_ops) for (_, i), p in t.programs.items())[-2:], t.complete)
y.zero_()
t = meter(lambda: launch(x, y, 1), [], programs=4)
print(len(t.programs), (int((y != 0).sum()) <= 4 * 64), t.grids)
t = meter(lambda: launch(x, y, 100000), [], programs=1, budget_s=0.5)
print(t.complete)
a = audit(lambda: launch(x, y, 1), lambda: [], budget_s=30, first=2)
print(a.covered, a.total, len(a.traffic.programs), a.traffic.complete, a.independent)

@triton.jit
def shift_kernel(s_ptr, y_ptr, n, BLOCK: tl.constexpr):  # reads what another program wrote
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(s_ptr + (offs + BLOCK) % n, mask=offs < n), mask=offs < n)

def two_kernels(x, s, y):
    scale_kernel[(triton.cdiv(x.numel(), 64),)](x, s, x.numel(), BLOCK=64, REPEAT=1)
    shift_kernel[(triton.cdiv(x.numel(), 64),)](s, y, x.numel(), BLOCK=64)

t = meter(lambda: two_kernels(x, torch.zeros(1000), y), [], programs=4)
a = audit(lambda *args: two_kernels(*args), lambda: [x, torch.zeros(1000), torch.zeros(1000)], budget_s=30)
print(t.independent, a.independent, a.covered, a.total, bool((a.args[2] == torch.roll(2 * x, -64)).all()))

@triton.jit
def sums_kernel(x_ptr, y_ptr, REPEAT: tl.constexpr):  # a tile loaded once, reduced again and again
    x = tl.load(x_ptr + tl.arange(0, 64))
    s = tl.sum(x, 0)
    for _ in tl.range(0, REPEAT):
        s = tl.sum(x, 0)
    tl.store(y_ptr, s)

few, many = (meter(lambda: sums_kernel[(1,)](x, y, REPEAT=r), [], programs=None).programs[("sums_kernel", (0, 0, 0))]
             for r in (10, 30))
print(many.op_calls - few.op_calls, few.move_calls, many.move_calls)
'''


def test_the_meter_counts_what_each_program_moves_and_stops_at_its_budget(tmp_path):
    """sim_meter under Triton's interpreter: bytes of the lanes a mask lets through (the last
    program of 1000 floats in blocks of 64 moves 40 of them), every program or a sample (the
    others write nothing), the float element-operations (all 64 lanes of `x * 2`), a program
    longer than the budget stopped (`complete` False), the audit metering every program, and
    each reduction counted as an operation."""
    import subprocess
    import sys
    pytest.importorskip("triton")
    (tmp_path / "m.py").write_text(_METERED)
    out = subprocess.run([sys.executable, str(tmp_path / "m.py")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "[(14, 256, 1, 64), (15, 160, 1, 64)] True", lines
    assert lines[1] == "4 True [('scale_kernel', (16, 1, 1))]", lines
    assert lines[2] == "False", lines
    assert lines[3] == "16 16 16 True True", lines  # the audit: every program, in batches of 2, 4, 8...
    # Two kernels, the second reading what the first's other programs wrote: not independent,
    # so the audit runs every program in one launch (and gets the right result).
    assert lines[4] == "False False 16 16 True", lines
    # Each reduction is an operation (numpy's, outside the builder): 20 more of them, 20 more.
    assert lines[5] == "20 2 2", lines


def test_a_bf16_matmul_is_right_under_the_interpreter(fast_settings, tmp_path):
    """Triton's interpreter keeps bfloat16 data as its uint16 bits, and its tl.dot multiplied
    those bits as integers: the library's bf16 matmul read ~1e11 where the reference is tens,
    a WRONG_RESULT for an honest kernel (interpreter_fixed widens the operands first)."""
    from tuner.exec.evaluate import Evaluator
    ev = Evaluator("sim", builtin_spec("matmul", "128x256x64", "bf16"), library_skeleton("matmul", "triton_ascend"),
                   fast_settings, tmp_path)
    try:
        ev.start()
        rec = ev.evaluate(ev.skeleton.space.default_config())
    finally:
        ev.close()
    assert rec.status is Status.OK, rec.reason


_BF16_OPS = '''
import sys, torch, triton, triton.language as tl
from tuner.backends.triton_device import interpreter_fixed
interpreter_fixed()

@triton.jit
def ops_kernel(a_ptr, b_ptr, c_ptr, X: tl.constexpr):
    r = tl.arange(0, 64)
    a = tl.load(a_ptr + r)
    b = tl.load(b_ptr + r)
    if X == 0:
        c = a + b * a - b / a
    elif X == 1:
        c = tl.where(a > b, -a, tl.maximum(a, b))
    elif X == 2:
        c = a + tl.sum(b, 0) - tl.max(b, 0)
    else:
        c = tl.cumsum(a, 0)
    tl.store(c_ptr + r, c)

torch.manual_seed(0)
refs = [lambda a, b: a + b * a - b / a, lambda a, b: torch.where(a > b, -a, torch.maximum(a, b)),
        lambda a, b: a + b.sum() - b.max(), lambda a, b: torch.cumsum(a, 0)]
for x, ref in enumerate(refs):
    a, b = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    c = torch.zeros(64, dtype=torch.bfloat16)
    ops_kernel[(1,)](a, b, c, X=x)
    want = ref(a.float(), b.float())
    print(x, bool(((c.float() - want).abs() <= 0.05 * want.abs() + 0.3).all()))
'''


def test_bf16_arithmetic_is_right_under_the_interpreter(tmp_path):
    """The interpreter's arithmetic, compares, reductions and scans on bf16 blocks worked on
    their uint16 bits (`a + b` NaN, `a > b` wrong across signs, `tl.sum` ~1e22); a GPU computes
    them in float32, and so does the interpreter once fixed (interpreter_fixed)."""
    import subprocess
    import sys
    pytest.importorskip("triton")
    (tmp_path / "m.py").write_text(_BF16_OPS)
    out = subprocess.run([sys.executable, str(tmp_path / "m.py")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "True", "1", "True", "2", "True", "3", "True"], out.stdout


def test_a_sampled_run_tells_a_kernel_writing_nan_from_one_writing_nothing():
    """Above the interpreted size only a sample of programs runs, and what they wrote is told
    from what they did not by the poison the outputs held. With NaN as the poison (half of the
    harness's draws) a kernel writing NaN read as one that wrote nothing and passed; the
    sampled runs' poison is always finite now, so NaN written anywhere is held to the
    reference, and an element left alone still reads as not written."""
    import torch

    from tuner.backends.sim_checks import poisoned_copies, wrong_where_written
    op = load_op(builtin_spec("softmax", "4x8"))
    x = torch.randn(4, 8)
    for _ in range(40):
        copies, poisons = poisoned_copies(op, [x, torch.zeros(4, 8)])
        y = copies[1]
        assert math.isfinite(poisons[0]) and bool((y == poisons[0]).all())
        y[:2] = float("nan")  # two rows "computed" as NaN, the rest left alone
        why = wrong_where_written(op, [x], [y], poisons, whole=False)
        assert why is not None and "16 of the 16 elements the metered programs wrote are off" in why, why
        y[:2] = torch.softmax(x[:2], -1)  # right where written: the rest is the unsampled programs'
        assert wrong_where_written(op, [x], [y], poisons, whole=False) is None


def test_a_scalar_loop_is_refused_however_little_of_it_the_meter_ran():
    """A program spinning in scalar arithmetic before its first load: a loaded machine's
    meter, stopped by its time budget, had counted 59489 one-element operations, under the
    element slack, and let it through to an interpreted run that hung. Its calls give it away
    at any speed; a program's few index calls per load do not."""
    from tuner.backends.sim_checks import understated
    from tuner.backends.sim_meter import ProgramTraffic, Traffic
    cost = Cost(kind="vector", programs=20, tiles=20, tile_load=((12000, 1),), tile_store=((12000, 1),),
                tile_vector=15000)
    spun = Traffic(programs={("k", (0, 0, 0)): ProgramTraffic(other_ops=59489, op_calls=59489)},
                   complete=False)
    why = understated(cost, spun)
    assert why and "no term for: program (0, 0, 0) of k (in the part metered) made 59489 element-wise" in why, why
    honest = Traffic(programs={("k", (0, 0, 0)): ProgramTraffic(
        load_bytes=12000, store_bytes=12000, loads=1, stores=1, vector_ops=15000, move_calls=2,
        other_ops=90000, op_calls=250)})
    assert understated(cost, honest) is None


def test_a_float_scalar_loop_is_refused_though_its_operations_are_declared():
    """The declared vector work is element-operations of the vector unit; a loop of one-element
    float operations (here 50,000, under the 100,000 declared) is scalar work the model never
    charges."""
    from tuner.backends.sim_checks import understated
    from tuner.backends.sim_meter import ProgramTraffic, Traffic
    cost = Cost(kind="vector", programs=20, tiles=20, tile_load=((12000, 1),), tile_store=((12000, 1),),
                tile_vector=100000)
    spun = Traffic(programs={("k", (0, 0, 0)): ProgramTraffic(
        load_bytes=12000, store_bytes=12000, loads=1, stores=1, vector_ops=50000, op_calls=50050, move_calls=2)})
    why = understated(cost, spun)
    assert why and "made 50050 element-wise operations for its 2 loads, stores and dots" in why, why
