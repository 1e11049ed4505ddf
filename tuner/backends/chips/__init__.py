"""Per-chip profiles of Ascend NPUs: what the `sim` backend models and what `npu` checks against.

A profile is a YAML file in this folder (shipped as package data), one per chip: 910B1, 910B2,
910B3, 910B4, 910_93, 310P3. A file may name a `base` profile whose fields it inherits, and keeps
a `provenance` mapping that says where each figure came from (official docs, CANN's ini, msKPP,
press, derived, assumed): most are not measured by us and several sources disagree, so every
number is data to calibrate, never a constant in code.

`load_profile(x)` takes a chip name (`910B2`, `Ascend910B2`, case-insensitive), a path to a
profile YAML, or a path to CANN's `platform_config/<SoC>.ini` (`parse_ini`), which is the
authority on a machine with CANN installed: what the ini has overrides the built-in profile of
the same SoC (or 910B1), and what it lacks (transfer curves, overheads) comes from that base.
"""

from __future__ import annotations

import re

import configparser
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
TRANSFERS = ("gm_to_ub", "ub_to_gm", "gm_to_l1", "l0c_to_gm")


class ChipError(ValueError):
    """An unknown chip, or a profile / ini that cannot be used. Says which and why."""


@dataclass(frozen=True)
class ChipProfile:
    name: str  # "910B2"
    soc: str  # "Ascend910B2": what torch.npu.get_device_name / driver get_arch() report
    family: str = "A2"
    coupled: bool = False  # cube and vector in one core (310P, 910A), vs 1 AIC + 2 AIV (A2/A3)
    triton_ascend: bool = True  # whether triton-ascend targets it
    cube_cores: int = 24  # AIC: the grid of tl.dot kernels binds to these
    vector_cores: int = 48  # AIV: the grid of vector-only kernels binds to these
    clock_mhz: float = 1800.0
    ub_bytes: int = 196608  # per vector core
    l1_bytes: int = 524288  # per cube core
    l0a_bytes: int = 65536
    l0b_bytes: int = 65536
    l0c_bytes: int = 131072
    l2_bytes: int = 201326592
    hbm_bytes: int = 68719476736
    hbm_gbps: float = 1600.0  # chip-wide, GB/s (1e9)
    l2_bw_ratio: float = 5.0
    ub_align: int = 32  # tail-axis alignment of vector kernels (bytes); shorter tails are padded
    cv_align: int = 512  # ... of cube/mixed kernels
    vector_bytes_per_cycle: float = 128.0  # per vector core
    cube_flops_per_cycle: tuple[tuple[str, float], ...] = (("bf16", 8192.0), ("fp16", 8192.0),
                                                           ("fp32", 2048.0))
    mmad_overhead_cycles: float = 3.0
    l1_to_l0a_bytes_per_cycle: float = 256.0
    l1_to_l0b_bytes_per_cycle: float = 128.0
    # name -> ((KiB, GiB/s), ...): single-core throughput of one transfer of that size
    transfers: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    curve_clock_mhz: float = 1850.0  # the clock the curves were measured at
    launch_us: float = 10.0
    program_start_us: float = 1.0
    step_cycles: float = 150.0
    sync_cycles: float = 400.0
    provenance: tuple[tuple[str, str], ...] = ()
    source: str = ""  # the file(s) it was read from

    # ---- derived -----------------------------------------------------------------------

    @property
    def clock_hz(self) -> float:
        return self.clock_mhz * 1e6

    def cube_rate(self, dtype: str) -> float:
        """Cube flop per cycle per AIC for inputs of `dtype` (fp16 when the chip lacks it)."""
        rates = dict(self.cube_flops_per_cycle)
        return rates.get(dtype) or rates.get("fp16") or 8192.0

    def curve(self, name: str) -> tuple[tuple[float, float], ...]:
        d = dict(self.transfers)
        if name not in d:
            raise ChipError(f"chip {self.name}: no transfer curve {name!r}; it has {sorted(d)}")
        return d[name]

    def transfer_s(self, name: str, nbytes: float) -> float:
        """Seconds one core takes for one transfer of `nbytes` on path `name`: a fixed latency
        plus size over bandwidth, piecewise through the measured points (the first segment
        extended to size 0 gives the latency, the last segment's slope continues past the
        largest point). Curves are in cycles of `curve_clock_mhz`; a chip at another clock
        takes the same cycles."""
        if nbytes <= 0:
            return 0.0
        pts = [(kib * 1024.0, kib * 1024.0 / (gibps * 2**30)) for kib, gibps in self.curve(name)]
        scale = self.curve_clock_mhz / self.clock_mhz
        if len(pts) == 1:
            s0, t0 = pts[0]
            return t0 * nbytes / s0 * scale
        (s0, t0), (s1, t1) = pts[0], pts[1]
        if nbytes <= s0:  # extend the first segment down to its intercept (the latency)
            slope = (t1 - t0) / (s1 - s0)
            return max(t0 + (nbytes - s0) * slope, t0 * nbytes / s0) * scale
        for (sa, ta), (sb, tb) in zip(pts, pts[1:]):
            if nbytes <= sb:
                return (ta + (tb - ta) * (nbytes - sa) / (sb - sa)) * scale
        sb, tb = pts[-1]
        peak_slope = 1.0 / (self.curve(name)[-1][1] * 2**30)  # saturated bandwidth
        return (tb + (nbytes - sb) * peak_slope) * scale

    def latency_s(self, name: str) -> float:
        """The fixed part of a transfer (its time at size -> 0)."""
        return self.transfer_s(name, 1.0)

    def peak_core_gbps(self, name: str) -> float:
        return self.curve(name)[-1][1] * 2**30 / 1e9 * self.clock_mhz / self.curve_clock_mhz

    def limits(self) -> dict[str, float]:
        """Resource caps by the names spaces use."""
        return {"ub_bytes": float(self.ub_bytes), "l1_bytes": float(self.l1_bytes),
                "l0a_bytes": float(self.l0a_bytes), "l0b_bytes": float(self.l0b_bytes),
                "l0c_bytes": float(self.l0c_bytes)}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cube_flops_per_cycle"] = dict(self.cube_flops_per_cycle)
        d["transfers"] = {k: [list(p) for p in v] for k, v in self.transfers}
        d["provenance"] = dict(self.provenance)
        return d


# ---- loading -----------------------------------------------------------------------------

def available() -> list[str]:
    """The built-in chip names."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def _builtin_path(name: str) -> Path | None:
    key = name.strip().lower()
    if key.startswith("ascend"):
        key = key[len("ascend"):]
    for p in HERE.glob("*.yaml"):
        if p.stem.lower() == key:
            return p
    for p in HERE.glob("*.yaml"):  # by SoC string, e.g. Ascend910_9382 -> 910_93
        data = yaml.safe_load(p.read_text()) or {}
        if str(data.get("soc", "")).lower() == name.strip().lower():
            return p
    return None


def _raw(path: Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A profile file's data with its `base` chain folded in (the file wins)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ChipError(f"cannot read chip profile {path}: {e}") from None
    if not isinstance(data, dict):
        raise ChipError(f"{path}: a chip profile is a YAML mapping")
    base = data.pop("base", None)
    if base is None:
        data["source"] = str(path)
        return data
    if base in seen:
        raise ChipError(f"{path}: profile base loop through {base}")
    bpath = _builtin_path(str(base)) if not Path(str(base)).is_file() else Path(str(base))
    if bpath is None:
        raise ChipError(f"{path}: unknown base profile {base!r}; built-in: {', '.join(available())}")
    merged = _raw(bpath, seen + (str(base),))
    prov = {**merged.get("provenance", {}), **data.get("provenance", {})}
    merged.update(data)
    merged["provenance"] = prov
    merged["source"] = f"{path} (base {merged.get('source', bpath)})"
    return merged


def profile_from_dict(data: dict[str, Any], source: str = "") -> ChipProfile:
    known = {f.name for f in fields(ChipProfile)}
    unknown = set(data) - known
    if unknown:
        raise ChipError(f"{source or 'chip profile'}: unknown field(s) {sorted(unknown)}; "
                        f"known: {sorted(known)}")
    d = dict(data)
    for name in ("name", "soc", "family"):  # YAML reads 910_93 as a number
        if name in d:
            d[name] = str(d[name])
    try:  # a hand-written profile may give any YAML here: say which field, not a TypeError
        field = "cube_flops_per_cycle"
        if field in d:
            d[field] = tuple(sorted((str(k), float(v)) for k, v in dict(d[field]).items()))
        field = "transfers"
        if field in d:
            tr = dict(d[field])
            for k, v in tr.items():
                if not v or any(len(p) != 2 or p[0] <= 0 or p[1] <= 0 for p in v):
                    raise ChipError(f"{source}: transfer curve {k} must be [[KiB, GiB/s], ...] with positive numbers")
            d[field] = tuple(sorted((k, tuple((float(a), float(b)) for a, b in sorted(v))) for k, v in tr.items()))
        field = "provenance"
        if field in d:
            d[field] = tuple(sorted((str(k), str(v)) for k, v in dict(d[field]).items()))
    except ChipError:
        raise
    except (TypeError, ValueError):
        raise ChipError(f"{source or 'chip profile'}: {field} is malformed: {d[field]!r} (see the built-in "
                        f"profiles in tuner/backends/chips/ for its form)") from None
    if source and not d.get("source"):
        d["source"] = source
    try:
        prof = ChipProfile(**d)
    except TypeError as e:
        raise ChipError(f"{source}: {e}") from None
    missing = [t for t in TRANSFERS if t not in dict(prof.transfers)]
    if missing:
        raise ChipError(f"{source or prof.name}: no transfer curve(s) {missing}")
    for name in ("cube_cores", "vector_cores", "clock_mhz", "ub_bytes", "hbm_gbps"):
        v = getattr(prof, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ChipError(f"{source or prof.name}: {name} must be a positive number, got {v!r}")
    for f in fields(ChipProfile):  # every other numeric field is at least a number
        v = getattr(prof, f.name)
        if type(f.default) in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                or not math.isfinite(v)):
            raise ChipError(f"{source or prof.name}: {f.name} must be a number, got {v!r}")
    return prof


def load_profile(chip: str | Path, base: str | None = None) -> ChipProfile:
    """A chip by name, a profile YAML, or a CANN `platform_config/<SoC>.ini` (`base` picks the
    built-in profile that fills what an ini lacks)."""
    if isinstance(chip, ChipProfile):
        return chip
    text = str(chip)
    path = Path(text)
    if text.lower().endswith(".ini"):
        if not path.is_file():
            raise ChipError(f"no such ini file: {path}")
        return parse_ini(path.read_text(), str(path), base)
    if text.lower().endswith((".yaml", ".yml")):
        if not path.is_file():
            raise ChipError(f"no such chip profile: {path}")
        return profile_from_dict(_raw(path), str(path))
    p = _builtin_path(text)
    if p is None:
        import difflib
        close = difflib.get_close_matches(text.upper(), [c.upper() for c in available()], n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ChipError(f"unknown chip {text!r}{hint}; built-in: {', '.join(available())}, or give a "
                        f"profile .yaml or CANN's platform_config/<SoC>.ini")
    return profile_from_dict(_raw(p), str(p))


# SoC names torch_npu reports -> the built-in profile of the same chip layout (UB, L1, L0 and
# the core split are the same within a row; core counts and clock come from the device at
# run time). A name that matches none is refused: a wrong profile's UB size would let
# configs through that cannot fit, or keep out ones that do.
SOC_FAMILIES = (
    (re.compile(r"^Ascend910B1(?:[-_ ]?\w*)?$", re.I), "910B1"),
    (re.compile(r"^Ascend910B2(?:[-_ ]?\w*)?$", re.I), "910B2"),  # 910B2C: the same die
    (re.compile(r"^Ascend910B3(?:[-_ ]?\w*)?$", re.I), "910B3"),
    (re.compile(r"^Ascend910B4(?:[-_ ]?\w*)?$", re.I), "910B4"),  # 910B4-1
    (re.compile(r"^Ascend910_93\d\d$", re.I), "910_93"),  # 9362, 9372, 9382, 9391, 9392: one die each
    (re.compile(r"^Ascend310P3$", re.I), "310P3"),
)


def profile_for_soc(soc: str) -> tuple[ChipProfile, str]:
    """(the built-in profile for a SoC name torch_npu reports, how it was chosen), or
    ChipError naming the SoC and what to pass instead."""
    if _builtin_path(soc) is not None:
        return load_profile(soc), "exact"
    for pattern, name in SOC_FAMILIES:
        if pattern.match(soc.strip()):
            return load_profile(name), f"{soc} is a {name} layout"
    raise ChipError(f"no chip profile for the SoC {soc!r} (built-in: {', '.join(available())}); pass "
                    f"one with --chip: a profile .yaml, or CANN's platform_config/{soc}.ini from the "
                    f"toolkit's data/platform_config folder")


# ---- CANN platform_config/<SoC>.ini --------------------------------------------------------

# ini key (section, option) -> (profile field, conversion). Option names are case-insensitive.
_INI = {
    ("SoCInfo", "ai_core_cnt"): "ai_core_cnt",
    ("SoCInfo", "cube_core_cnt"): "cube_cores",
    ("SoCInfo", "vector_core_cnt"): "vector_core_cnt",
    ("SoCInfo", "l2_size"): "l2_bytes",
    ("SoCInfo", "memory_size"): "hbm_bytes",
    ("AICoreSpec", "cube_freq"): "clock_mhz",
    ("AICoreSpec", "l0_a_size"): "l0a_bytes",
    ("AICoreSpec", "l0_b_size"): "l0b_bytes",
    ("AICoreSpec", "l0_c_size"): "l0c_bytes",
    ("AICoreSpec", "l1_size"): "l1_bytes",
    ("AICoreSpec", "ub_size"): "ub_bytes",
    ("AICoreSpec", "ubblock_size"): "ub_align",
    ("AICoreMemoryRates", "ddr_rate"): "ddr_rate",
    ("AICoreMemoryRates", "l1_to_l0_a_rate"): "l1_to_l0a_bytes_per_cycle",
    ("AICoreMemoryRates", "l1_to_l0_b_rate"): "l1_to_l0b_bytes_per_cycle",
    ("VectorCoreMemoryRates", "ddr_rate"): "vector_ddr_rate",
    ("VectorCoreSpec", "vec_freq"): "vec_freq",
}


def parse_ini(text: str, source: str = "<ini>", base: str | None = None) -> ChipProfile:
    """A profile from the text of CANN's `platform_config/<SoC>.ini`.

    Read: `[version] SoC_version`, `[SoCInfo]` (ai_core_cnt, cube_core_cnt, vector_core_cnt,
    l2_size, memory_size), `[AICoreSpec]` (cube_freq, l0_a/b/c_size, l1_size, ub_size,
    ubblock_size), `[AICoreMemoryRates]` (ddr_rate, l1_to_l0_a/b_rate, bytes per cycle per core)
    and `[DtypeMKN]` (the cube's fractal: Default=16,16,16 gives 2*16*16*16 fp16 flop per
    cycle). HBM bandwidth is derived as ddr_rate x cores x clock when the ini has ddr_rate (plus
    the standalone vector cores' `[VectorCoreMemoryRates] ddr_rate x vector_core_cnt x
    [VectorCoreSpec] vec_freq` on a coupled chip): the built-in profiles use the same rule, so a
    run that reads the installed ini and one that does not model the same chip.
    Everything else comes from `base` (default: the built-in profile of the same SoC, else
    910B1); provenance marks which fields the ini set."""
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str.lower  # CANN's keys are lower case; accept any case
    try:
        cp.read_string(text, source)
    except configparser.Error as e:
        raise ChipError(f"{source}: not an ini file: {e}") from None
    sections = {s.lower(): s for s in cp.sections()}

    def get(section: str, option: str) -> str | None:
        s = sections.get(section.lower())
        if s is None or not cp.has_option(s, option):
            return None
        return cp.get(s, option).strip()

    soc = get("version", "SoC_version") or get("version", "soc_version")
    if not soc and not sections.get("socinfo"):
        raise ChipError(f"{source}: no [version] SoC_version and no [SoCInfo]: not a CANN platform_config ini")
    base_name = base or (soc if soc and _builtin_path(soc) else "910B1")
    prof = load_profile(base_name)
    raw: dict[str, float] = {}
    for (section, option), name in _INI.items():
        v = get(section, option)
        if v in (None, ""):
            continue
        try:
            raw[name] = float(v)
        except ValueError:
            raise ChipError(f"{source}: [{section}] {option}={v!r} is not a number") from None
    set_fields: dict[str, Any] = {}
    prov = dict(prof.provenance)
    for name in ("l2_bytes", "hbm_bytes", "l0a_bytes", "l0b_bytes", "l0c_bytes", "l1_bytes", "ub_bytes",
                 "ub_align"):
        if name in raw:
            set_fields[name] = int(raw[name])
    for name in ("clock_mhz", "l1_to_l0a_bytes_per_cycle", "l1_to_l0b_bytes_per_cycle"):
        if name in raw:
            set_fields[name] = raw[name]
    aic = raw.get("cube_cores") or raw.get("ai_core_cnt")
    if aic:
        set_fields["cube_cores"] = int(aic)
    if prof.coupled:  # a vector kernel runs on the coupled AI cores' vector units
        if raw.get("ai_core_cnt"):
            set_fields["vector_cores"] = int(raw["ai_core_cnt"])
    elif raw.get("vector_core_cnt"):
        set_fields["vector_cores"] = int(raw["vector_core_cnt"])
    mkn = get("DtypeMKN", "Default")
    if mkn:
        try:
            m, k, n = (int(x) for x in mkn.split(","))
        except ValueError:
            raise ChipError(f"{source}: [DtypeMKN] Default={mkn!r}: expected M,K,N") from None
        rates = dict(prof.cube_flops_per_cycle)
        scale = 2.0 * m * k * n / rates.get("fp16", 8192.0)
        set_fields["cube_flops_per_cycle"] = tuple(sorted((d, r * scale) for d, r in rates.items()))
        prov["cube_flops_per_cycle"] = f"INI [DtypeMKN] Default={mkn} (2*M*K*N fp16 flop/cycle; others scaled)"
    for name in set_fields:
        if name != "cube_flops_per_cycle":
            prov[name] = f"INI {source}"
    if raw.get("ddr_rate"):
        clock = set_fields.get("clock_mhz", prof.clock_mhz)
        cores = set_fields.get("cube_cores", prof.cube_cores)
        gbps = raw["ddr_rate"] * cores * clock * 1e6 / 1e9
        how = f"ddr_rate {raw['ddr_rate']:g} B/cycle x {cores} cores x {clock:g} MHz"
        # A coupled chip (310P) also has standalone vector cores with their own rate and clock:
        # together they draw what the memory gives (8 x 17 x 1.06 + 7 x 9 x 1.0 = 207 GB/s on a
        # 310P3, whose LPDDR4X is sold as 204.8 GB/s).
        v_rate, v_cores, v_freq = (raw.get("vector_ddr_rate"), raw.get("vector_core_cnt"),
                                   raw.get("vec_freq"))
        if prof.coupled and v_rate and v_cores and v_freq:
            gbps += v_rate * v_cores * v_freq * 1e6 / 1e9
            how += f" + {v_rate:g} x {v_cores:g} vector cores x {v_freq:g} MHz"
        set_fields["hbm_gbps"] = gbps
        prov["hbm_gbps"] = f"DER {how} ({source})"
    if soc:
        set_fields["soc"] = soc
        set_fields["name"] = soc[len("Ascend"):] if soc.startswith("Ascend") else soc
    return replace(prof, **set_fields, provenance=tuple(sorted(prov.items())),
                   source=f"{source} (base {prof.name})")


__all__ = ["ChipProfile", "ChipError", "available", "load_profile", "parse_ini", "profile_from_dict"]

