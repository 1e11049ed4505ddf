"""Recorded landscapes: every (or many) configs of one space measured on one device at one
shape, read as a lookup table (`Landscape.lookup`) for the replay backend, warm starts and the
offline comparison of search strategies (`tuner.offline.replay`).

Two formats are read:

* a landscape JSON (`record_matmul.py`'s format): `{"space": {param: [values]}, "shapes":
  [[M, N, K], ...], "records": [{"config", "compile", "compile_err", "compile_s",
  "runs": {"MxNxK": {"status": "ok", "ms"} | {"status": "runtime_error", "err_msg"}}}],
  "reference": {"MxNxK": ms}, "device"}` -- several shapes in one file;
* the tool's own run directory (or its `records.jsonl`), typically from an exhaustive
  `tuner tune ... --sampler grid --budget <space size>` run: one shape, with the run's own
  space (constraints and resource formulas included) in `skeleton/space.json`. The records
  may be gzipped (`records.jsonl.gz`, for landscapes kept for good: ~10x smaller).

`skeleton_files` writes a skeleton whose rendering names a landscape and a config, and
`parse_script` reads such a rendering back: that is how the `replay` backend answers through
the whole pipeline.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tuner.core.op import DTYPE_BYTES
from tuner.core.space import Param, Space
from tuner.core.values import Config, Record, RunMeta, Status

_JSON_STATUS = {"ok": Status.OK, "runtime_error": Status.RUNTIME_ERROR, "wrong": Status.WRONG_RESULT,
                "wrong_result": Status.WRONG_RESULT, "compile_error": Status.COMPILE_ERROR,
                "timeout": Status.RUN_TIMEOUT, "run_timeout": Status.RUN_TIMEOUT,
                "compile_timeout": Status.COMPILE_TIMEOUT}


class LandscapeError(ValueError):
    """A landscape file that cannot be read, or a shape it does not hold."""


@dataclass(frozen=True)
class Outcome:
    """What happened to one config: its status, its time when OK, why it failed otherwise."""

    status: Status
    seconds: float = math.inf
    detail: str = ""
    compile_s: float = 0.0


@dataclass
class Landscape:
    space: Space
    outcomes: dict[str, Outcome]  # config key -> outcome
    name: str = ""
    shape: str = ""
    device: str = ""
    reference_s: float | None = None
    context: dict[str, Any] = field(default_factory=dict)  # sizes the space's formulas read
    limits: dict[str, float] = field(default_factory=dict)  # the recorded device's limits

    @property
    def best_s(self) -> float:
        return min((o.seconds for o in self.outcomes.values() if o.status is Status.OK), default=math.inf)

    def lookup(self, config: Config) -> Outcome | None:
        return self.outcomes.get(config.key)

    def within(self, tolerance: float) -> set[str]:
        """Keys of the configs at most `tolerance` (0.03: 3 %) slower than the best."""
        cut = self.best_s * (1 + tolerance)
        return {k for k, o in self.outcomes.items() if o.status is Status.OK and o.seconds <= cut}

    def ranked(self, k: int | None = None) -> list[Config]:
        """The OK configs, fastest first (warm starts for a related search)."""
        ok = sorted((o.seconds, key) for key, o in self.outcomes.items() if o.status is Status.OK)
        return [Config.of(json.loads(key)) for _, key in ok[:k]]


# ---- loading ------------------------------------------------------------------------------

def shapes(path: str | Path) -> list[str]:
    """The shapes a landscape file holds (one, unnamed, for a run directory)."""
    path = Path(path)
    if _is_run(path):
        return [""]
    data = read_json(path)
    if not isinstance(data, dict):
        raise LandscapeError(f"{path}: a landscape JSON has 'space' (param -> values) and 'records'")
    return [_shape_key(s) for s in data.get("shapes", [])] or sorted(data.get("reference", {}))


def load(path: str | Path, shape: str | None = None) -> Landscape:
    """A landscape JSON at one of its shapes (`4096x4096x4096`; optional when it holds one),
    or a run directory / its records.jsonl."""
    path = Path(path)
    if _is_run(path):
        return _load_run(path)
    return _load_json(path, shape)


_cache: dict[tuple[str, str, float], Landscape] = {}


def load_cached(path: str | Path, shape: str | None = None) -> Landscape:
    """`load`, kept per process (a backend answers every config of a search from one file)."""
    p = Path(path).resolve()
    target = _records_path(p) if p.is_dir() else p
    try:
        mtime = target.stat().st_mtime
    except OSError as e:
        raise LandscapeError(f"cannot read landscape {path}: {e.strerror}") from None
    key = (str(p), shape or "", mtime)
    if key not in _cache:
        _cache[key] = load(p, shape)
    return _cache[key]


def _is_run(path: Path) -> bool:
    return path.is_dir() or path.name.endswith((".jsonl", ".jsonl.gz"))


def _records_path(run: Path) -> Path:
    plain = run / "records.jsonl"
    return plain if plain.exists() or not (run / "records.jsonl.gz").exists() else run / "records.jsonl.gz"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise LandscapeError(f"cannot read landscape {path}: {e.strerror}") from None
    except ValueError as e:
        raise LandscapeError(f"{path} is not JSON ({e}); a landscape or warm-start source is a run "
                             f"directory, its records.jsonl, a landscape JSON or a JSON list of configs") from None


def _shape_key(shape: Any) -> str:
    return "x".join(str(v) for v in shape) if isinstance(shape, (list, tuple)) else str(shape)


def _load_json(path: Path, shape: str | None) -> Landscape:
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("space"), dict) or not isinstance(data.get("records"), list):
        raise LandscapeError(f"{path}: a landscape JSON has 'space' (param -> values) and 'records'")
    have = shapes(path)
    if shape is None:
        if len(have) != 1:
            raise LandscapeError(f"{path} holds {len(have)} shapes; pick one of {', '.join(have)}")
        shape = have[0]
    if shape not in have:
        raise LandscapeError(f"{path} has no shape {shape!r}; it has {', '.join(have)}")
    space = Space(tuple(Param(n, tuple(v), _pow2(v)) for n, v in data["space"].items()),
                  source=f"{path}@{shape}", meta=(("language", "script"),))
    outcomes: dict[str, Outcome] = {}
    for r in data["records"]:
        config = Config.of(r["config"])
        compile_s = float(r.get("compile_s", 0.0) or 0.0)
        if r.get("compile", "ok") != "ok":
            status = _JSON_STATUS.get(r["compile"], Status.COMPILE_ERROR)
            if status is Status.RUN_TIMEOUT:
                status = Status.COMPILE_TIMEOUT
            outcomes[config.key] = Outcome(status if status is not Status.OK else Status.COMPILE_ERROR,
                                           detail=r.get("compile_err", ""), compile_s=compile_s)
            continue
        run = r.get("runs", {}).get(shape)
        if run is None:
            continue  # not measured at this shape: replay reports it as unrecorded
        status = _JSON_STATUS.get(run.get("status"), Status.RUNTIME_ERROR)
        if status is Status.OK:
            outcomes[config.key] = Outcome(Status.OK, float(run["ms"]) / 1e3, compile_s=compile_s)
        else:
            detail = run.get("err_msg") or f"recorded {run.get('status')}" + (
                f" (error {run['err']:.3g})" if isinstance(run.get("err"), (int, float)) else "")
            outcomes[config.key] = Outcome(status, detail=detail, compile_s=compile_s)
    ref = data.get("reference", {}).get(shape)
    return Landscape(space, outcomes, name=f"{path.stem}@{shape}", shape=shape,
                     device=str(data.get("device", "")),
                     reference_s=float(ref) / 1e3 if isinstance(ref, (int, float)) else None)


def _pow2(values: Iterable[Any]) -> bool:
    """Consecutive powers of two (what a space's {pow2: [lo, hi]} declares)."""
    vs = list(values)
    return (len(vs) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in vs)
            and vs[0] > 0 and vs[0] & (vs[0] - 1) == 0 and all(b == 2 * a for a, b in zip(vs, vs[1:])))


def _load_run(path: Path) -> Landscape:
    run = path if path.is_dir() else path.parent
    records_path = _records_path(path) if path.is_dir() else path
    records = _records_from(records_path)
    if not records:
        raise LandscapeError(f"{records_path} holds no records")
    space_json = run / "skeleton" / "space.json"
    meta: RunMeta | None = None  # a bare records file, or a damaged run.json: the records alone
    if (run / "run.json").is_file():
        try:
            meta = RunMeta.from_json(json.loads((run / "run.json").read_text()))
        except ValueError:
            pass
    if space_json.is_file():
        space = Space.from_json(json.loads(space_json.read_text()))
    else:  # infer a space from the values seen
        names = sorted({k for r in records for k in r.config.as_dict()})
        space = Space(tuple(Param(n, tuple(sorted({r.config[n] for r in records}, key=_order)))
                            for n in names), source=str(records_path))
    outcomes: dict[str, Outcome] = {}
    for r in records:
        if r.status is Status.OK:
            o = Outcome(Status.OK, r.seconds, compile_s=r.build.compile_s)
        else:
            o = Outcome(r.status, detail=r.reason.splitlines()[0][:500] if r.reason else "",
                        compile_s=r.build.compile_s)
        prev = outcomes.get(r.config.key)
        # A winner re-check that failed is appended after the OK record: the later word wins.
        outcomes[r.config.key] = o if prev is None or o.status is not Status.OK else prev
    device = meta.device if meta else None
    context: dict[str, Any] = meta.op.size_dict() if meta else {}
    if meta:
        context["DTYPE_BYTES"] = DTYPE_BYTES.get(meta.op.dtype, 4)
    if device and device.cores:
        context["CORES"] = device.cores
    return Landscape(space, outcomes, name=run.name, shape=records[0].op_key,
                     device=device.name if device else records[0].device, context=context,
                     limits=dict(device.limits) if device else {})


def _records_from(path: Path) -> list[Record]:
    out = []
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt") as f:
                lines = f.read().splitlines()
        else:
            lines = path.read_text().splitlines()
    except OSError as e:  # gzip's own errors (a truncated or not-gzip file) are OSErrors too
        raise LandscapeError(f"cannot read {path}: {e.strerror or e}") from None
    except EOFError:
        raise LandscapeError(f"cannot read {path}: the gzip stream is truncated") from None
    for i, line in enumerate(lines):
        if line.strip():
            try:
                out.append(Record.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                if i != len(lines) - 1:
                    raise LandscapeError(f"{path}:{i + 1}: corrupt record line") from None
    return out


def _order(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, repr(v))


# ---- the skeleton that the pipeline replays through ----------------------------------------

def skeleton_files(path: str | Path, shape: str | None, out: str | Path) -> tuple[Path, Path]:
    """Write `replay.yaml` (the landscape's space) and `replay.txt.j2` (a template whose
    rendering names the landscape, the shape and the config) under `out`."""
    src = Path(path).resolve()
    land = load(src, shape)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["language: script", f"description: replay of {land.name} measured on {land.device or '?'}",
             "params:"]
    for p in land.space.params:
        if _pow2(p.values):
            lines.append(f"  {p.name}: {{pow2: [{p.values[0]}, {p.values[-1]}]}}")
        else:
            lines.append(f"  {p.name}: {json.dumps(list(p.values))}")
    sj = land.space.to_json()
    if sj["sizes"]:
        lines.append(f"sizes: {json.dumps(sj['sizes'])}")
    if sj["resources"]:
        lines.append("resources:")
        lines += [f"  {n}: {json.dumps(t)}" for n, t in sj["resources"].items()]
    if sj["constraints"]:
        lines.append("constraints:")
        lines += [f"  - {json.dumps(t)}" for t in sj["constraints"]]
    if sj["default"]:
        lines.append(f"default: {json.dumps(sj['default'])}")
    space_path = out / "replay.yaml"
    space_path.write_text("\n".join(lines) + "\n")
    config = ", ".join(f'"{p.name}": {{{{ {p.name} | tojson }}}}' for p in land.space.params)
    template = (f"# replay: answered from a recorded landscape, not run\n"
                f"landscape: {src}\n" + (f"shape: {land.shape}\n" if not _is_run(src) else "")
                + f"config: {{{config}}}\n")
    template_path = out / "replay.txt.j2"
    template_path.write_text(template)
    return space_path, template_path


def parse_script(source: str) -> dict[str, Any]:
    """The rendered replay script: landscape path, optional shape, config."""
    out: dict[str, Any] = {}
    for n, line in enumerate(source.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, sep, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if not sep or k not in ("landscape", "shape", "config"):
            raise ValueError(f"line {n}: expected 'landscape:', 'shape:' or 'config:', got {line!r}")
        out[k] = json.loads(v) if k == "config" else v
    if "landscape" not in out or "config" not in out:
        raise ValueError("a replay script names a 'landscape:' and a 'config:'")
    return out
