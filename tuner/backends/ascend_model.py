"""The analytical model of an Ascend AI core that the `sim` backend times kernels with: a
kernel's declared `ASCEND_COST` (`Cost`, its keys in COST_KEYS), checked against the chip's
buffers (`check_capacity`), and its modelled device time (`estimate`) and the op's bound on the
chip (`roofline_s`), per chip profile (tuner/backends/chips).

**Time** = the model (`estimate`), per chip profile:

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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tuner.backends.ascend_source import MULTIBUFFER_DEFAULT

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
