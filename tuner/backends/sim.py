"""The `sim` backend: an analytical model of Ascend AI cores, for machines without an NPU.

It consumes the same triton_ascend skeletons and spaces as the `npu` backend. Every figure it
reports is a model's output, never a measurement: DeviceInfo.simulated is True, the device is
named after the chip profile, and the toolchain says `model: analytical`.

**Compile** = check and analyse the rendered module, statically: the same AST contract and
launch-option checks as `npu`, then the module's `ASCEND_COST` description (a tuple of
(name, value) pairs the template computes from its config and the op's sizes; see COST_KEYS)
is validated against the chip: UB capacity (multibuffer doubles the loop's buffers) with the
real compiler's error text, `ub overflow, requires N bits while M bits available`; L1/L0
capacity for cube kernels (the wording of those errors is ours, not the compiler's). Tail axes
that are not 32 B (vector) or 512 B (cube/mixed) multiples are padded, as triton-ascend pads
them rather than failing: the padding counts towards the bytes every transfer moves.

**Time** = the model (`estimate`), per chip profile (tuner/chips):

* the grid binds to cores: `programs` run in ceil(programs / cores) rounds; the busiest core
  gets rounds x ceil(tiles / programs) tiles of `steps` pipelined steps each;
* one transfer of b bytes takes the chip's measured single-core time for that size (latency +
  size / bandwidth, msKPP's curves), and never less than b over the core's share of memory
  bandwidth when all active cores stream at once; memory bandwidth blends HBM (the op's
  distinct bytes, read once) and L2 (re-reads, at l2_bw_ratio x HBM, as far as the distinct
  bytes fit in L2);
* per step: in (MTE2), compute (vector element-ops at 128 B/cycle, or cube flops plus the
  L1->L0 moves), out (MTE3), and a fixed scalar cost; with `multibuffer` (the default on A2/A3)
  and at least two steps the stages overlap (steady state = the slowest stage, or in + out
  sharing GM bandwidth), without it they add up; a `drain` (a pass that needs the previous one
  complete) costs a sync and a pipeline refill;
* cube kernels: per output tile the L0C->GM write-out (hidden behind the next tile's mmad with
  `unit_flag`); mixed kernels add a vector part per tile (split over the 2 AIVs with
  `enable_auto_bind_sub_block`, the default), serialised with the cube part unless
  `tile_mix_cube_loop` / `tile_mix_vector_loop` split them into segments that overlap, each
  segment paying a cross-core sync (halved by `sync_solver`);
* the chip: the busiest core's time, never less than all bytes over that memory bandwidth,
  plus a fixed launch overhead.

Several inputs are assumptions (see each profile's `provenance`); the model's job is to rank
configs plausibly, and tests pin the shapes it must have (bigger tiles amortise transfer
latency until UB overflows, double buffering pays when transfer and compute balance, fewer
programs than cores waste the chip, a 910B4 is slower than a 910B2 on memory-bound ops).

**Verification**: with `verify="interpret"` (the default up to `verify_max_elements` elements
moved, inputs and outputs) the rendered kernel, its Ascend options stripped, runs through Triton's interpreter on
CPU tensors and is checked against the reference like on any device, so a wrong template fails
here. Above that size (`verify="reference"`) the interpreter would take minutes per config, so
the timed calls write the float64 reference; the kernel runs only in part: the programs the
first checked launch meters (their outputs checked where they wrote) and the winner's audit
(every program within its budget, the outputs checked whole), and device_info's toolchain says
`verify: partial (...)`. Timed calls never re-run the interpreter (a repeated launch on unchanged
inputs is answered from the first), nor the reference (one per input set and op).

**The declared costs are checked against the op and the kernel**: when compiled, the whole
launch's declared bytes (and a matmul's cube flops) must cover the op's own (`short_of_the_op`);
the first checked launch meters a sample of the kernel's programs through the interpreter
(sim_meter) and refuses a declaration that understates what they moved or computed
(`understated`; both in sim_checks.py); the winner's `memcheck` meters every program (or as many as `audit_s` allow).

The reference (torch eager) has no NPU to run on. Every backend must time one, so the sim
reports the op's roofline bound on the chip instead: its bytes at HBM bandwidth or its flops at
the cube (matmul) or vector peak, whichever is longer, plus the launch overhead, i.e. an ideal
vendor kernel. The summary's "vs torch eager" row on a `sim` run therefore compares with that
bound (toolchain `reference` says so), and reads at most about 1x.

Options: `chip` (a built-in name, a profile YAML or a CANN platform_config ini; default 910B2),
`verify` ("auto", "interpret", "reference"), `verify_max_elements` (default 131072), `audit_s`
(default 30: the winner's metering budget), `real_compile` (default true).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from tuner.backends.base import Backend, BackendUnavailable, Refused
from tuner.backends.sim_checks import poisoned_copies, short_of_the_op, understated, wrong_where_written
from tuner.backends.npu import MULTIBUFFER_DEFAULT, check_launch_options, launches, read_cost, strip_options
from tuner.backends.triton_source import load_module
from tuner.codecheck import Forbidden, require_clean
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

DEFAULT_CHIP = "910B2"
VERIFY_MAX_ELEMENTS = 1 << 17

# The ASCEND_COST description a template renders (values are per the op's sizes and the config).
COST_KEYS = {
    "kind": "vector | cube | mix: which cores the grid binds to (AIV; AIC for tl.dot kernels)",
    "programs": "the grid the launch uses",
    "tiles": "work items the programs loop over (row groups, blocks, output tiles)",
    "steps": "pipelined steps per tile (column chunks, K steps); default 1",
    "step_load": "per step: ((bytes, count), ...) moved GM->UB (vector) or GM->L1 (cube)",
    "step_store": "per step: ((bytes, count), ...) moved UB->GM (count may be fractional: an average)",
    "step_vector": "per step: fp32 vector element-operations",
    "step_cube": "per step: (m, n, k) of the mmad",
    "tile_load": "per tile, outside the step loop: ((bytes, count), ...) GM->UB",
    "tile_store": "per tile, outside the step loop: ((bytes, count), ...) UB->GM",
    "tile_vector": "per tile, outside the step loop: fp32 vector element-operations",
    "tile_out": "cube: bytes written L0C->GM per tile",
    "mix_load": "mixed: per tile, bytes the vector part reads GM->UB",
    "mix_store": "mixed: per tile, bytes the vector part writes UB->GM",
    "mix_vector": "mixed: per tile, the vector part's fp32 element-operations",
    "drains": "per tile: pipeline drains (a pass that needs the previous pass complete)",
    "setup_load": "per program, once: ((bytes, count), ...) GM->UB (weights kept resident)",
    "ub_bytes": "UB bytes of the loop's buffers (doubled by multibuffer)",
    "ub_fixed": "UB bytes outside the loop's buffers (not doubled)",
    "l1_bytes": "cube: L1 bytes per step (doubled by multibuffer)",
    "l0a_bytes": "cube: L0A bytes per step (doubled by multibuffer)",
    "l0b_bytes": "cube: L0B bytes per step (doubled by multibuffer)",
    "l0c_bytes": "cube: L0C bytes (the accumulator tile)",
    "tail_bytes": "bytes along the tensors' last axis: transfers are padded to 32 B (vector) or 512 B (cube)",
    "unique_bytes": "distinct GM bytes the kernel touches (default: the op's bytes); the rest re-reads L2",
}
KINDS = ("vector", "cube", "mix")
ADAPTER_KINDS = {"aiv": "vector", "aic": "cube", "mix": "mix"}  # triton-ascend's mix_mode -> kind
MAX_PROGRAMS = 65535


# Seconds the winner's audit may meter programs for (memcheck; option audit_s).
AUDIT_S = 30.0


class CostError(ValueError):
    """An ASCEND_COST description that cannot be modelled."""


@dataclass(frozen=True)
class Cost:
    kind: str
    programs: int
    tiles: int
    steps: int = 1
    step_load: tuple[tuple[float, float], ...] = ()
    step_store: tuple[tuple[float, float], ...] = ()
    step_vector: float = 0.0
    step_cube: tuple[int, int, int] | None = None
    tile_load: tuple[tuple[float, float], ...] = ()
    tile_store: tuple[tuple[float, float], ...] = ()
    tile_vector: float = 0.0
    tile_out: float = 0.0
    mix_load: float = 0.0
    mix_store: float = 0.0
    mix_vector: float = 0.0
    drains: float = 0.0
    setup_load: tuple[tuple[float, float], ...] = ()
    ub_bytes: float = 0.0
    ub_fixed: float = 0.0
    l1_bytes: float = 0.0
    l0a_bytes: float = 0.0
    l0b_bytes: float = 0.0
    l0c_bytes: float = 0.0
    tail_bytes: float = 0.0
    unique_bytes: float = 0.0

    @classmethod
    def of(cls, data: dict[str, Any]) -> "Cost":
        unknown = set(data) - set(COST_KEYS)
        if unknown:
            raise CostError(f"ASCEND_COST: unknown key(s) {sorted(unknown)}; known: {', '.join(COST_KEYS)}")
        for key in ("kind", "programs", "tiles"):
            if key not in data:
                raise CostError(f"ASCEND_COST: no {key!r} ({COST_KEYS[key]})")
        if data["kind"] not in KINDS:
            raise CostError(f"ASCEND_COST: kind {data['kind']!r}: one of {', '.join(KINDS)}")
        d = dict(data)
        for key in ("step_load", "step_store", "tile_load", "tile_store", "setup_load"):
            if key in d:
                d[key] = _transfers(key, d[key])
        if d.get("step_cube") is not None:
            sc = d["step_cube"]
            if not (isinstance(sc, tuple) and len(sc) == 3 and all(_num(x) and x > 0 for x in sc)):
                raise CostError(f"ASCEND_COST: step_cube must be (m, n, k), got {sc!r}")
        for key, value in d.items():
            if key in ("kind", "step_cube") or key in ("step_load", "step_store", "tile_load",
                                                       "tile_store", "setup_load"):
                continue
            if not _num(value) or value < 0:
                raise CostError(f"ASCEND_COST: {key} must be a number >= 0, got {value!r}")
        for key in ("programs", "tiles", "steps"):
            if key in d and (int(d[key]) != d[key] or d[key] < 1):
                raise CostError(f"ASCEND_COST: {key} must be a positive integer, got {d[key]!r}")
            if key in d:
                d[key] = int(d[key])
        if d["kind"] != "vector" and d.get("step_cube") is None:
            raise CostError(f"ASCEND_COST: a {d['kind']} kernel needs step_cube (m, n, k)")
        return cls(**d)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _transfers(key: str, value: Any) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and _num(p[0]) and _num(p[1]) and p[0] >= 0 and p[1] >= 0
            for p in value):
        raise CostError(f"ASCEND_COST: {key} must be ((bytes, count), ...), got {value!r}")
    return tuple((float(b), float(n)) for b, n in value)


# ---- checks and the model ---------------------------------------------------------------------

def _pad_factor(cost: Cost, profile) -> float:
    align = profile.ub_align if cost.kind == "vector" else profile.cv_align
    if cost.tail_bytes <= 0:
        return 1.0
    padded = math.ceil(cost.tail_bytes / align) * align
    return padded / cost.tail_bytes


def ub_required_bytes(cost: Cost, profile, multibuffer: bool) -> float:
    """UB bytes the kernel needs: the loop's buffers (twice with multibuffer) plus the rest. The
    template declares buffers as allocated (its tiles are powers of two, so already aligned)."""
    return (2 if multibuffer else 1) * cost.ub_bytes + cost.ub_fixed


def check_capacity(cost: Cost, profile, multibuffer: bool) -> str | None:
    """Why the kernel cannot fit the chip's on-core memories (the compile error), or None."""
    need = ub_required_bytes(cost, profile, multibuffer)
    if need > profile.ub_bytes:
        return ("MLIRCompilationError: [ConvertLinalgRToBinary] error: Failed to run BishengHIR pipeline\n"
                f"error: ub overflow, requires {int(math.ceil(need * 8))} bits while "
                f"{profile.ub_bytes * 8} bits available! (simulated: the {profile.name} model's UB check; "
                f"multibuffer={multibuffer} doubles the loop's buffers)")
    if cost.kind != "vector":
        buffers = 2 if multibuffer else 1
        for what, used, cap in (("L1", buffers * cost.l1_bytes, profile.l1_bytes),
                                ("L0A", buffers * cost.l0a_bytes, profile.l0a_bytes),
                                ("L0B", buffers * cost.l0b_bytes, profile.l0b_bytes),
                                ("L0C", cost.l0c_bytes, profile.l0c_bytes)):
            if used > cap:
                return (f"sim: error: {what} overflow, requires {int(used)} bytes while {cap} bytes "
                        f"available (the simulator's {profile.name} check; the compiler's own wording "
                        f"for {what} overflows is not known to us)")
    if cost.programs > MAX_PROGRAMS:
        return f"coreDim={cost.programs} can't be greater than UINT16_MAX"
    return None


@dataclass(frozen=True)
class Estimate:
    seconds: float
    core_s: float
    hbm_s: float
    launch_s: float
    bound: str  # "core" or "hbm"
    active_cores: int
    rounds: int
    tiles_per_core: int
    step_in_s: float
    step_compute_s: float
    step_out_s: float
    overlapped: bool
    gm_bytes: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def estimate(cost: Cost, profile, options: dict[str, Any], dtype: str = "fp32",
             unique_bytes: float | None = None) -> Estimate:
    """The modelled device time of one launch (see the module docstring for the model).
    `unique_bytes`: the distinct GM bytes (ASCEND_COST's, else this, else all traffic)."""
    f = profile.clock_hz
    mb = bool(options.get("multibuffer", MULTIBUFFER_DEFAULT))
    cores = profile.vector_cores if cost.kind == "vector" else profile.cube_cores
    P = cost.programs
    active = min(P, cores)
    rounds = -(-P // cores)
    tiles_core = rounds * -(-cost.tiles // P)
    S = tiles_core * cost.steps
    pad = _pad_factor(cost, profile)

    def nbytes(pairs) -> float:
        return sum(b * pad * n for b, n in pairs)

    step_bytes = nbytes(cost.step_load) + nbytes(cost.step_store)
    gm = (cost.tiles * (cost.steps * step_bytes + nbytes(cost.tile_load) + nbytes(cost.tile_store)
                        + (cost.tile_out + cost.mix_load + cost.mix_store) * pad)
          + P * nbytes(cost.setup_load))
    # Distinct bytes come from HBM once; re-reads hit L2 (at l2_bw_ratio x HBM) as far as the
    # distinct bytes fit in it.
    unique = min(gm, cost.unique_bytes or unique_bytes or gm)
    reread = gm - unique
    hit = 1.0 if unique <= profile.l2_bytes else profile.l2_bytes / unique
    hbm_bps = profile.hbm_gbps * 1e9
    t_mem = (unique + reread * (1 - hit)) / hbm_bps + reread * hit / (hbm_bps * profile.l2_bw_ratio)
    share = (gm / t_mem if t_mem > 0 else hbm_bps) / active  # a core's share when all active cores stream

    def xfer(path: str, pairs) -> float:
        t = 0.0
        for b, n in pairs:
            if b > 0 and n > 0:
                b = b * pad
                t += n * max(profile.transfer_s(path, b), b / share)
        return t

    vec_rate = profile.vector_bytes_per_cycle / 4 * f  # fp32 element-ops per second per AIV
    scalar = profile.step_cycles / f
    sync = profile.sync_cycles / f
    in_path = "gm_to_ub" if cost.kind == "vector" else "gm_to_l1"
    t_in = xfer(in_path, cost.step_load)
    t_out = xfer("ub_to_gm", cost.step_store)
    t_cmp = cost.step_vector / vec_rate
    if cost.step_cube is not None and cost.kind != "vector":
        m, n, k = cost.step_cube
        s = 2 if dtype in ("fp16", "bf16") else 4
        mte1 = (m * k * s / profile.l1_to_l0a_bytes_per_cycle + k * n * s / profile.l1_to_l0b_bytes_per_cycle) / f
        mmad = (2.0 * m * n * k / profile.cube_rate(dtype) + profile.mmad_overhead_cycles) / f
        t_cmp += max(mte1, mmad) if mb else mte1 + mmad
    overlapped = mb and S >= 2

    def pipeline(n_steps: int) -> float:
        if n_steps <= 0:
            return 0.0
        if mb and n_steps >= 2:
            steady = max(t_in, t_cmp, t_out, step_bytes / share)
            return (n_steps - 1) * steady + t_in + t_cmp + t_out + n_steps * scalar
        return n_steps * (t_in + t_cmp + t_out + scalar)

    refill = (t_in + t_out) if overlapped else 0.0
    t_drains = cost.drains * (sync + refill)
    t_tile_v = (xfer("gm_to_ub", cost.tile_load) + cost.tile_vector / vec_rate
                + xfer("ub_to_gm", cost.tile_store))
    if cost.kind == "vector":
        core = pipeline(S) + tiles_core * (t_drains + t_tile_v)
    else:
        # Cube: steps pipeline within a tile; the tile's accumulator goes out L0C->GM.
        t_steps_tile = pipeline(cost.steps)
        t_fix = profile.transfer_s("l0c_to_gm", cost.tile_out * pad) if cost.tile_out else 0.0
        t_fix = max(t_fix, cost.tile_out * pad / share)
        if options.get("unit_flag"):
            t_fix = max(0.0, t_fix - cost.steps * t_cmp) + sync / 4  # hidden behind the next mmad
        cube_tile = t_steps_tile + t_fix + t_tile_v + t_drains
        if cost.kind == "mix":
            vec = (max(profile.transfer_s("gm_to_ub", cost.mix_load * pad), cost.mix_load * pad / share)
                   + cost.mix_vector / vec_rate
                   + max(profile.transfer_s("ub_to_gm", cost.mix_store * pad), cost.mix_store * pad / share))
            if options.get("enable_auto_bind_sub_block", True):
                vec /= 2  # the two AIVs of the AIC share the vector part
            segs = max(int(options.get("tile_mix_cube_loop") or 1), int(options.get("tile_mix_vector_loop") or 1))
            sync_cost = sync * (0.5 if options.get("sync_solver") else 1.0)
            tile = max(cube_tile, vec) + min(cube_tile, vec) / segs + segs * sync_cost
        else:
            tile = cube_tile
        core = tiles_core * tile
    core += rounds * xfer("gm_to_ub", cost.setup_load) + (rounds - 1) * profile.program_start_us * 1e-6
    hbm = t_mem
    launch = profile.launch_us * 1e-6
    return Estimate(seconds=max(core, hbm) + launch, core_s=core, hbm_s=hbm, launch_s=launch,
                    bound="hbm" if hbm > core else "core", active_cores=active, rounds=rounds,
                    tiles_per_core=tiles_core, step_in_s=t_in, step_compute_s=t_cmp, step_out_s=t_out,
                    overlapped=overlapped, gm_bytes=gm)


def roofline_s(profile, flops: float | None, nbytes: float, matmul: bool) -> float:
    """The op's bound on the chip: its bytes at HBM bandwidth, its flops at the cube (matmul)
    or vector peak, whichever is longer, plus the launch overhead."""
    t = nbytes / (profile.hbm_gbps * 1e9)
    if flops:
        peak = (profile.cube_rate("fp16") * profile.cube_cores if matmul
                else profile.vector_bytes_per_cycle / 4 * profile.vector_cores) * profile.clock_hz
        t = max(t, flops / peak)
    return t + profile.launch_us * 1e-6


# ---- the backend ---------------------------------------------------------------------------------

class SimKernel:
    """A 'loaded' simulated kernel: its modelled seconds and how to produce its outputs
    (`interpreted`: by running the candidate's launch through Triton's interpreter)."""

    def __init__(self, seconds: float, run: Callable[[list], None], interpreted: bool = False,
                 cost: Cost | None = None, launch: Callable[..., None] | None = None, op=None):
        self.seconds = seconds
        self.run = run
        self.interpreted = interpreted
        self.cost = cost  # the declaration the time is modelled from
        self.launch = launch  # the module's own launch, for the meter (sim_meter)
        self.op = op  # the live op (its reference and tolerance check what the meter's programs wrote)
        self.metered: str | None = None  # "" once metered and covered; else why not


class SimBackend(Backend):
    name = "sim"
    language = "triton_ascend"

    @classmethod
    def bench_env(cls, env: dict[str, str]) -> dict[str, str]:
        # The interpreter from the process's start: Triton builds triton.language's own @jit
        # helpers (tl.cdiv, ...) when it is first imported, interpreted or not, and a kernel
        # interpreted later that calls one fails "Cannot call @triton.jit'd outside of the
        # scope of a kernel" (Triton 3.9, where the worker had imported it before the first
        # load). Compile workers are not benchmark workers: they keep the real front end.
        return {**env, "TRITON_INTERPRET": "1"}

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        from tuner.backends.chips import ChipError, load_profile
        try:
            self.profile = load_profile(options.get("chip") or DEFAULT_CHIP)
        except ChipError as e:
            raise BackendUnavailable(f"sim: {e}") from None
        self.verify = options.get("verify", "auto")
        if self.verify not in ("auto", "interpret", "reference"):
            raise BackendUnavailable(f"sim: verify={self.verify!r}: one of auto, interpret, reference")
        self._time: float | None = None
        # (kernel, args, their versions) of the last runs: the timed calls rotate over a few
        # buffer sets (tuner/exec/measure.py), and each would otherwise interpret the kernel
        # again (half a second a call for a small-block config at 37x1000: a minute's timing)
        self._recent: list[tuple] = []
        self._ref_fn: Any = None
        self._refs: dict = {}  # ids of an input set -> (inputs, versions, op spec, outputs): see load
        self._mode: str | None = None
        self._spec = OpSpec.from_json(options["op"]) if options.get("op") else None


    # ---- facts ----------------------------------------------------------------------------

    def render_context(self, op) -> dict[str, Any]:
        p = self.profile
        return {"CORES": p.vector_cores, "AIV": p.vector_cores, "AIC": p.cube_cores,
                "UB_BYTES": p.ub_bytes}

    def limits(self) -> dict[str, float]:
        return self.profile.limits()

    def _verify_mode(self) -> str:
        if self.verify != "auto":
            return self.verify
        if self._spec is None:
            return "interpret"
        if self._mode is None:
            from tuner.core.ops import DTYPE_BYTES, load_op
            n = load_op(self._spec).bytes / DTYPE_BYTES[self._spec.dtype]  # elements moved, in and out
            limit = int(self.options.get("verify_max_elements", VERIFY_MAX_ELEMENTS))
            self._mode = "interpret" if n <= limit else "reference"
        return self._mode

    def device_info(self, peaks: bool = True) -> DeviceInfo:  # nothing measured either way
        p = self.profile
        mode = self._verify_mode()
        verify = ("Triton interpreter on CPU tensors (Ascend options stripped)" if mode == "interpret"
                  else "partial: the op is too large to interpret every call; what the first "
                       "checked launch's metered programs write is checked against the reference "
                       "(the winner's audit: every program within its budget, the outputs whole), "
                       "the timed calls get the reference copied into their outputs")
        tools = {"model": "analytical (tuner.backends.sim); every time is modelled, none measured",
                 "chip_profile": p.source or p.name, "soc": p.soc, "verify": verify,
                 "reference": "not torch: the op's roofline bound on this chip (bytes at HBM bandwidth or "
                              "flops at peak) plus launch overhead",
                 "aic": str(p.cube_cores), "aiv": str(p.vector_cores), "clock_mhz": f"{p.clock_mhz:g}"}
        if not p.triton_ascend:
            tools["note"] = f"{p.soc} is not a triton-ascend target; modelled as if it were"
        tools["compile"] = self._compile_stage()
        peaks = {"copy_gbps": p.hbm_gbps}
        for dt, rate in p.cube_flops_per_cycle:  # the cube's peak per input dtype
            peaks[f"{dt}_gflops"] = rate * p.cube_cores * p.clock_mhz / 1e3
        return DeviceInfo(backend="sim", name=p.soc, cores=p.vector_cores,
                          limits=tuple(sorted(self.limits().items())), peaks=tuple(sorted(peaks.items())),
                          toolchain=tuple(sorted(tools.items())), simulated=True)

    # ---- 'compile': static checks and analysis ---------------------------------------------

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        t0 = time.monotonic()
        if op != self._spec:  # the op this compile models (a compile worker serves every op of a sweep)
            self._spec, self._mode = op, None

        def fail(error: str) -> Build:
            return Build(Status.COMPILE_ERROR, error=error, compile_s=time.monotonic() - t0)

        try:
            require_clean("triton_ascend", source)
            why = check_launch_options(source)
            raw = read_cost(source)
        except SyntaxError as e:
            return fail(f"SyntaxError: {e.msg} (line {e.lineno})")
        except Forbidden as e:
            return fail(str(e))
        except ValueError as e:
            return fail(f"sim: error: {e}")
        if why:
            return fail(why)
        if raw is None:
            return fail("sim: error: the module has no ASCEND_COST description; the simulator models a "
                        "kernel from it (README, 'Ascend simulator': keys " + ", ".join(COST_KEYS) + ")")
        try:
            cost = Cost.of(raw)
        except CostError as e:
            return fail(f"sim: error: {e}")
        options = {}
        for la in launches(source):
            options.update(la.ascend_options)
        grids = {la.grid for la in launches(source) if la.grid is not None}
        if grids and all(math.prod(g) != cost.programs for g in grids):
            return fail(f"sim: error: ASCEND_COST says programs={cost.programs} but the launch grid is "
                        f"{sorted(grids)}")
        mb = bool(options.get("multibuffer", MULTIBUFFER_DEFAULT))
        why = check_capacity(cost, self.profile, mb) or short_of_the_op(cost, *self._op_floor())
        if why:
            return fail(why)
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "kernel.ascend.py").write_text(source)
        (wd / "kernel.py").write_text(strip_options(source))
        real = self._real_compile(wd / "kernel.ascend.py", op, timeout_s - (time.monotonic() - t0))
        if real is not None and real.get("status") != "ok":
            return fail(real["error"])
        if real is not None:
            # The adapter knows the kernel's kind: a template's ASCEND_COST that says otherwise
            # is modelled as the compiler will build it.
            kinds = {ADAPTER_KINDS.get(k.get("mix_mode", "")) for k in real["kernels"]} - {None}
            if len(kinds) == 1 and cost.kind not in kinds:
                cost = dataclasses.replace(cost, kind=kinds.pop())
        est = estimate(cost, self.profile, options, self._dtype(), self._op_bytes())
        artifact = wd / "sim.json"
        artifact.write_text(json.dumps({"chip": self.profile.name, "cost": raw, "options": options,
                                        "kernel": str(wd / "kernel.py"), "estimate": est.to_json(),
                                        "ub_required_bytes": ub_required_bytes(cost, self.profile, mb),
                                        "compiled_by": real or {"frontend": "none", "why": self._frontend_why()}},
                                       default=list, indent=1))
        return Build(Status.OK, artifact=str(artifact), compile_s=time.monotonic() - t0,
                     binary_hash=hashlib.sha256(source.encode()).hexdigest()[:16])

    def _real_compile(self, path: Path, op: OpSpec, timeout_s: float) -> dict | None:
        """The module through triton-ascend's real front end and adapter (ascend_frontend), as
        {"status": "ok", "kernels": [...], ...} or {"status": "error", "error": message}; None
        where no triton-ascend can be found (then only the static checks above ran) or with
        option real_compile=False."""
        from tuner.backends.ascend_frontend import AscendFrontend
        if not self.options.get("real_compile", True):
            return None
        fe = AscendFrontend.find()
        if fe is None:
            return None
        from tuner.backends.base import _arg_specs
        ins, outs = _arg_specs(op)
        args = [[list(shape), str(dt).replace("torch.", "")] for shape, dt in ins + outs]
        out = fe.compile(str(path), args, len(ins), self.profile.soc, str(path.parent / "ascend_cache"),
                         max(30.0, timeout_s))
        if out.get("status") == "ok":
            return {"status": "ok", "frontend": f"triton-ascend {fe.version}", "kernels": out.get("kernels", []),
                    "stopped_before_bishengir": out.get("stopped_before_bishengir", False)}
        if out.get("status") == "error":
            return {"status": "error", "error": f"triton-ascend {fe.version} ({out.get('stage', '?')}): "
                                                f"{out.get('message', '').strip()}"}
        # The stage itself failed (a timeout, a broken environment): the config's failure only
        # when it timed out; otherwise said as the tool's.
        if out.get("status") == "timeout":
            return {"status": "error", "error": out.get("message", "")}
        raise BackendUnavailable(f"sim: triton-ascend's front end could not run: {out.get('message', '')}")

    def _compile_stage(self) -> str:
        """What checks a candidate before it is modelled, for the run's summary."""
        from tuner.backends.ascend_frontend import AscendFrontend
        fe = AscendFrontend.find() if self.options.get("real_compile", True) else None
        if fe is None:
            return f"static checks only (no triton-ascend: {self._frontend_why()})"
        return f"triton-ascend {fe.version}'s own front end and adapter (real), up to bishengir, which needs CANN"

    def _frontend_why(self) -> str:
        from tuner.backends.ascend_frontend import AscendFrontend
        if not self.options.get("real_compile", True):
            return "real_compile=False"
        return AscendFrontend.why_not()

    def _dtype(self) -> str:
        return self._spec.dtype if self._spec else "fp32"

    def _op_floor(self) -> tuple[float | None, float | None]:
        """(the op's bytes, its flops where they are a matmul's): what a declaration must cover."""
        if self._spec is None:
            return None, None
        from tuner.core.ops import load_op
        op = load_op(self._spec)
        return op.bytes, op.flops if self._spec.name == "matmul" else None

    def _op_bytes(self) -> float | None:
        """The op's own bytes (inputs and outputs once): the kernel's distinct GM bytes unless
        its ASCEND_COST says otherwise."""
        if self._spec is None:
            return None
        from tuner.core.ops import load_op
        return load_op(self._spec).bytes

    # ---- 'run': interpreter (or reference) outputs, modelled time ----------------------------

    def load(self, artifact: str, op) -> Any:
        rec = json.loads(Path(artifact).read_text())
        cost = Cost.of(_tuplify(rec["cost"]))
        seconds = estimate(cost, self.profile, rec["options"], op.spec.dtype, op.bytes).seconds
        os.environ["TRITON_INTERPRET"] = "1"
        from tuner.backends.triton_device import interpreter_fixed
        interpreter_fixed()
        path = Path(rec["kernel"])
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        launch = load_module(path, f"tuner_sim_{digest}", "triton_ascend").launch
        if self._verify_mode() == "interpret":
            return SimKernel(seconds, lambda args: launch(*args), interpreted=True, cost=cost, launch=launch, op=op)

        memo = self._refs

        def reference(args: list) -> None:  # not verified: the outputs get the reference
            n_in = len(op.input_names)
            ins, outs = list(args[:n_in]), list(args[n_in:])
            # The timed calls rotate over a few input sets: one float64 reference per set (and
            # per op: the memo is the backend's, so every config of the op shares it), else
            # every timed call recomputed it on the host, seconds each at 4096x4096.
            key = tuple(id(a) for a in ins)
            hit = memo.get(key)
            if hit is None or not _same(hit[0], ins, hit[1]) or hit[2] != op.spec:
                xs = [a.double() if a.is_floating_point() else a for a in ins]
                refs = [r.to(o.dtype) for r, o in zip(op.reference(xs), outs)]
                # held: the inputs keep their addresses, so an id is never another tensor's
                hit = memo[key] = (ins, [a._version for a in ins], op.spec, refs)
                while len(memo) > 8:
                    memo.pop(next(iter(memo)))
            for out, ref in zip(outs, hit[3]):
                out.copy_(ref)
        return SimKernel(seconds, reference, cost=cost, launch=launch, op=op)

    def launch(self, kernel: Any, args: list) -> None:
        self._time = kernel.seconds
        if any(k is kernel and _same(held, args, versions) for k, held, versions in self._recent):
            return  # the same kernel on the very same, unchanged tensors: the outputs hold it already
        kernel.run(args)
        # Holding the tensors keeps their addresses from being reused by the next check's.
        self._recent = [*self._recent[-(_RECENT - 1):], (kernel, list(args), [a._version for a in args])]

    def launch_checked(self, kernel: Any, args: list) -> None:
        """`launch`, after the kernel's first checked launch has been metered: a sample of its
        programs run through the interpreter at these arguments' shapes (sim_meter), and what
        they moved and computed held against the module's ASCEND_COST (the time is a model of
        that declaration, so it must cover the kernel). Wherever the candidate's launch
        function runs, it runs under a dispatch mode: any torch op besides allocation, views
        and the interpreter's own moves of the arguments is the op's work done on the host,
        which the model would never see. Raises Refused (HostCompute) with the reason."""
        from tuner.backends.triton_device import INTERPRETER_OK, without_host_compute
        if getattr(kernel, "launch", None) is not None and kernel.metered is None:
            # Where the whole kernel is interpreted anyway (small shapes), every program is
            # metered; above that a sample: a program it misses can still do more than declared.
            every = getattr(kernel, "interpreted", False)
            kernel.metered = self._meter(kernel, args, INTERPRETER_OK, None if every else 4)
        if kernel.metered:
            raise Refused(kernel.metered)
        if not getattr(kernel, "interpreted", False):
            return self.launch(kernel, args)
        without_host_compute(lambda: self.launch(kernel, args), INTERPRETER_OK)

    @staticmethod
    def _meter(kernel: SimKernel, args: list, allowed: frozenset[str], programs: int | None) -> str:
        """Why the kernel's declared costs do not cover it when metered, or ""; where the
        kernel is not otherwise run (above the interpreted size), also why what the metered
        programs wrote is not the op's result there."""
        from tuner.backends.sim_meter import MeterUnavailable, meter
        from tuner.backends.triton_device import without_host_compute
        # The metered run writes only a sample: never into the real outputs. Its outputs are
        # checked too, whole where every program ran: a kernel that did less when metered than
        # when checked would otherwise have its lighter run held to the declaration.
        copies, poisons = poisoned_copies(kernel.op, args)
        got: list = []
        try:
            without_host_compute(lambda: got.append(meter(kernel.launch, copies, programs)), allowed)
        except MeterUnavailable as e:
            raise BackendUnavailable(f"sim: the declared costs cannot be checked: {e}") from None
        why = understated(kernel.cost, got[0])
        if why:
            return why
        whole = programs is None and got[0].complete
        if not (whole or got[0].independent):
            return ""  # a sample of programs that read one another's results: not checkable alone
        n_in = len(kernel.op.input_names)
        return wrong_where_written(kernel.op, args[:n_in], copies[n_in:], poisons, whole) or ""

    def memcheck(self, artifact: str, op: OpSpec, timeout_s: float) -> str:
        """The winner's declaration held to every one of its programs (sim_meter.audit): its
        checked launches metered a sample only above the interpreted size, and a kernel can
        put the work in a program the sample missed (one program doing the others' rows, all
        of them modelled as one program's share). On fresh inputs, on copies, under the
        dispatch mode, within `audit_s` (option, default 30 s; the programs are drawn at random
        where not all fit): "clean" with the coverage, "errors: <why>" or "not run: <why>"."""
        from tuner.backends.sim_meter import MeterUnavailable, audit
        from tuner.backends.triton_device import INTERPRETER_OK, without_host_compute
        import random

        import torch

        from tuner.core.ops import arg_specs, load_op
        if op != self._spec:
            self._spec, self._mode = op, None
        live = load_op(op)
        kernel = self.load(artifact, live)
        if kernel.launch is None:
            return "not run: the kernel has no launch to meter"
        _, outs = arg_specs(live)
        xs = live.make_inputs(random.SystemRandom().randrange(1, 2**31))
        base = list(xs) + [torch.zeros(shape, dtype=dt) for shape, dt in outs]
        # The audit asks for a fresh set at most twice, inside the dispatch mode: made here.
        sets = [poisoned_copies(live, base) for _ in range(2)]
        poisons: list = []

        def make_args() -> list:
            copies, drawn = sets.pop()
            poisons[:] = drawn
            return copies
        budget = min(float(self.options.get("audit_s", AUDIT_S)), max(1.0, timeout_s - 10))
        got: list = []
        try:
            without_host_compute(lambda: got.append(audit(kernel.launch, make_args, budget)), INTERPRETER_OK)
        except MeterUnavailable as e:
            return f"not run: the declared costs cannot be checked: {e}"
        except Refused as e:
            return f"errors: {e}"
        except Exception as e:  # noqa: BLE001 - the kernel's own failure under the interpreter
            return f"errors: the kernel failed when metered: {type(e).__name__}: {e}"[:2000]
        a = got[0]
        whole = a.covered >= a.total and a.traffic.complete
        why = understated(kernel.cost, a.traffic)
        if not why and (whole or a.independent):
            why = wrong_where_written(live, xs, a.args[len(xs):], poisons, whole)
        if why:
            return f"errors: {why}"
        if whole:
            return (f"clean (every one of its {a.total} programs metered against ASCEND_COST, "
                    f"its outputs checked whole)")
        checked = ("what they wrote checked" if a.independent else
                   "outputs not checked: its programs depend on one another (several kernels or atomics)")
        return (f"clean ({a.covered} of its {a.total} programs, drawn at random, metered against "
                f"ASCEND_COST within {budget:.0f} s, {checked})")

    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        """The modelled seconds of the kernel `fn` launches; for anything else (the torch
        reference) the op's roofline bound on the chip (see the module docstring). `before`
        (the harness's poison of the outputs) is not run: the time is the model's, from the
        module's declared costs, so a kernel gains nothing by skipping work here, and outputs
        left as the last call wrote them let a repeated launch be answered from it instead of
        running the interpreter again for every timed call."""
        self._time = None
        if fn is self._ref_fn:  # the reference again: no need to run it on the host
            return self._reference_s()
        fn()
        if self._time is not None:
            return self._time
        self._ref_fn = fn
        return self._reference_s()

    def _reference_s(self) -> float:
        if self._spec is None:
            return self.profile.launch_us * 1e-6
        from tuner.core.ops import load_op
        op = load_op(self._spec)
        return roofline_s(self.profile, op.flops, op.bytes, self._spec.name == "matmul")


_RECENT = 4  # runs remembered: more than the buffer sets timed calls rotate over


def _same(held: list | None, args: list, versions: list | None) -> bool:
    return (held is not None and len(held) == len(args) and all(a is b for a, b in zip(held, args))
            and [a._version for a in args] == versions)


def _tuplify(x: Any) -> Any:
    """JSON lists back to the tuples ASCEND_COST uses."""
    if isinstance(x, list):
        return tuple(_tuplify(v) for v in x)
    if isinstance(x, dict):
        return {k: _tuplify(v) for k, v in x.items()}
    return x


def model_config(backend: SimBackend, skeleton, config, context: dict[str, Any]) -> Estimate | str:
    """One config through the simulator without workers or verification: rendered, checked
    ('compiled') and modelled. Returns the estimate, or why it is invalid or fails to compile."""
    why = skeleton.space.check(config, context, backend.limits())
    if why is not None:
        return f"INVALID: {why}"
    source = skeleton.render(config, context)
    try:
        require_clean("triton_ascend", source)
        err = check_launch_options(source)
        raw = read_cost(source)
    except (SyntaxError, Forbidden, ValueError) as e:
        return f"COMPILE_ERROR: {e}"
    if err or raw is None:
        return f"COMPILE_ERROR: {err or 'no ASCEND_COST'}"
    cost = Cost.of(raw)
    options: dict[str, Any] = {}
    for la in launches(source):
        options.update(la.ascend_options)
    err = check_capacity(cost, backend.profile, bool(options.get("multibuffer", MULTIBUFFER_DEFAULT)))
    if err:
        return f"COMPILE_ERROR: {err}"
    return estimate(cost, backend.profile, options, backend._dtype(), backend._op_bytes())


def model_space(op_name: str, shape: str, dtype: str = "fp32", chip: str = DEFAULT_CHIP,
                skeleton=None, configs=None) -> list[tuple[Any, Estimate | str]]:
    """Configs (default: every one) of an op's triton_ascend skeleton (or `skeleton`) on `chip`,
    modelled statically: what the sim backend would report, without workers or verification.
    For tests and benchmarks of the model itself."""
    from tuner.core.ops import builtin_spec, load_op, render_context
    from tuner.core.skeleton import library_skeleton
    spec = builtin_spec(op_name, shape, dtype)
    backend = SimBackend(0, chip=chip, op=spec.to_json(), verify="reference")
    skeleton = skeleton or library_skeleton(op_name, "triton_ascend")
    op = load_op(spec)
    context = {**render_context(op), **backend.render_context(op)}
    return [(c, model_config(backend, skeleton, c, context))
            for c in (configs if configs is not None else skeleton.space.configs())]
