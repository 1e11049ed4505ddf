"""The values that flow between the roles: frozen, picklable, and JSON round-trippable.

Every value that crosses a process boundary or goes to disk has `to_json()` and a
`from_json()` classmethod; `tests/test_values.py` round-trips each of them.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any


class Status(str, enum.Enum):
    """The verdict on one candidate. A candidate's failure is a status, never an exception."""

    OK = "OK"
    INVALID = "INVALID"  # violates a constraint or a resource limit; never compiled
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    RUNTIME_ERROR = "RUNTIME_ERROR"  # includes a crashed worker, with the signal
    RUN_TIMEOUT = "RUN_TIMEOUT"  # the kernel hung
    WRONG_RESULT = "WRONG_RESULT"
    SUSPECT = "SUSPECT"  # passed, but tripped an anti-cheat check
    # The machine failed under it twice (its process killed from outside: the OOM killer, an
    # operator): not the config's failure. The search learns nothing from it; a resume tries it again.
    INFRA_ERROR = "INFRA_ERROR"


@dataclass(frozen=True)
class Config:
    """An immutable param -> value mapping. `key` is canonical: sorted, JSON-encoded."""

    items: tuple[tuple[str, Any], ...]

    @staticmethod
    def of(mapping: dict[str, Any]) -> "Config":
        return Config(tuple(sorted((str(k), v) for k, v in mapping.items())))

    @property
    def key(self) -> str:
        return json.dumps(dict(self.items), sort_keys=True, separators=(",", ":"))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.items)

    def __getitem__(self, name: str) -> Any:
        return dict(self.items)[name]

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items)

    def to_json(self) -> dict[str, Any]:
        return self.as_dict()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Config":
        return cls.of(data)


@dataclass(frozen=True)
class OpSpec:
    """What to compute, as data: which op, at which sizes and dtype.

    The live parts (reference function, input maker) are resolved from this by
    `tuner.ops.load_op`, in whichever process needs them, so an OpSpec pickles and
    round-trips through JSON. `source` is a built-in op name or a path to a problem file.
    """

    name: str
    source: str
    sizes: tuple[tuple[str, int], ...]
    dtype: str = "fp32"
    kind: str = "builtin"  # "builtin" | "kernelbench"

    @property
    def key(self) -> str:
        sizes = ",".join(f"{k}={v}" for k, v in self.sizes)
        return f"{self.name}[{sizes}]:{self.dtype}"

    def size_dict(self) -> dict[str, int]:
        return dict(self.sizes)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "sizes": dict(self.sizes),
                "dtype": self.dtype, "kind": self.kind}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "OpSpec":
        return cls(name=data["name"], source=data["source"],
                   sizes=tuple((k, int(v)) for k, v in data["sizes"].items()),
                   dtype=data.get("dtype", "fp32"), kind=data.get("kind", "builtin"))


@dataclass(frozen=True)
class Build:
    """A compile outcome. `artifact` is a path (or backend-defined handle) on success."""

    status: Status
    artifact: str | None = None
    error: str = ""  # a short excerpt, for people and for the proposer
    compile_s: float = 0.0
    binary_hash: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Build":
        return cls(**{**data, "status": Status(data["status"])})


@dataclass(frozen=True)
class Measurement:
    """A verify-and-time outcome. Times are seconds; `samples` are the raw repetitions."""

    status: Status
    samples: tuple[float, ...] = ()
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    detail: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.inf

    @property
    def iqr(self) -> float:
        if len(self.samples) < 4:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "samples": list(self.samples),
                "max_abs_err": _finite(self.max_abs_err), "max_rel_err": _finite(self.max_rel_err),
                "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Measurement":
        return cls(status=Status(data["status"]), samples=tuple(data.get("samples", ())),
                   max_abs_err=_unfinite(data.get("max_abs_err", 0.0)),
                   max_rel_err=_unfinite(data.get("max_rel_err", 0.0)),
                   detail=data.get("detail", ""))


def _finite(x: float) -> float | str:
    # JSON has no inf/nan; keep them as strings rather than lose them.
    return x if math.isfinite(x) else repr(x)


def _unfinite(x: float | str) -> float:
    return float(x)


@dataclass(frozen=True)
class Record:
    """One evaluated config: everything needed to trust, reproduce or replay it."""

    op_key: str
    skeleton_hash: str
    config: Config
    build: Build
    measurement: Measurement
    device: str
    toolchain: tuple[tuple[str, str], ...] = ()
    time: float = 0.0  # unix seconds when it finished
    trial: int = -1  # the Optuna trial number that asked for it, -1 when none
    # What the search was told (seconds) when this config was timed against the incumbent in
    # one interleave (`tune.run_search`): the incumbent's figure times their ratio there. None:
    # its own median. The measurement keeps the raw samples either way.
    anchored_s: float | None = None

    @property
    def search_s(self) -> float:
        """The figure the search ranks this record by (`anchored_s`, else `seconds`)."""
        return self.anchored_s if self.anchored_s is not None and self.status is Status.OK else self.seconds

    @property
    def status(self) -> Status:
        if self.build.status is not Status.OK:
            return self.build.status
        return self.measurement.status

    @property
    def seconds(self) -> float:
        return self.measurement.median if self.status is Status.OK else math.inf

    @property
    def reason(self) -> str:
        return self.build.error if self.build.status is not Status.OK else self.measurement.detail

    def to_json(self) -> dict[str, Any]:
        return {"op_key": self.op_key, "skeleton_hash": self.skeleton_hash,
                "config": self.config.to_json(), "build": self.build.to_json(),
                "measurement": self.measurement.to_json(), "device": self.device,
                "toolchain": dict(self.toolchain), "time": self.time, "trial": self.trial,
                **({"anchored_s": self.anchored_s} if self.anchored_s is not None else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Record":
        return cls(op_key=data["op_key"], skeleton_hash=data["skeleton_hash"],
                   config=Config.from_json(data["config"]), build=Build.from_json(data["build"]),
                   measurement=Measurement.from_json(data["measurement"]), device=data["device"],
                   toolchain=tuple(sorted(data.get("toolchain", {}).items())),
                   time=data.get("time", 0.0), trial=data.get("trial", -1), anchored_s=data.get("anchored_s"))


@dataclass(frozen=True)
class DeviceInfo:
    """What a backend knows of its device. `limits` are named resource caps that a space's
    resource formulas are checked against (e.g. smem_bytes); `peaks` are measured ceilings."""

    backend: str
    name: str
    cores: int
    limits: tuple[tuple[str, float], ...] = ()
    peaks: tuple[tuple[str, float], ...] = ()  # e.g. ("copy_gbps", 20.1), ("fp32_gflops", 900.0)
    toolchain: tuple[tuple[str, str], ...] = ()
    simulated: bool = False

    def peak(self, name: str) -> float | None:
        return dict(self.peaks).get(name)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "name": self.name, "cores": self.cores,
                "limits": dict(self.limits), "peaks": dict(self.peaks),
                "toolchain": dict(self.toolchain), "simulated": self.simulated}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DeviceInfo":
        return cls(backend=data["backend"], name=data["name"], cores=int(data["cores"]),
                   limits=tuple(sorted(data.get("limits", {}).items())),
                   peaks=tuple(sorted(data.get("peaks", {}).items())),
                   toolchain=tuple(sorted(data.get("toolchain", {}).items())),
                   simulated=bool(data.get("simulated", False)))


def content_hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class RunMeta:
    """A run directory's `run.json`: what the run tunes, how it searches, where it came from.

    Written when the run is created; rewritten with `device` once the device is measured, and
    with `budget`/`patience`/`rounds` when a resume asks for more. One value for every kind of
    run: a single-skeleton run has `skeleton`; a multi-round run has `rounds` and `proposer`
    (each of its rounds is a single-skeleton run with `round` and `parent_run`); a retune has
    `retune_of`; a sweep's task has `sweep`. Keys this version does not know (a newer tool's)
    are kept in `other` and written back as they were.
    """

    id: str
    op: OpSpec
    backend: str
    sampler: str = "guided"
    seed: int = 0
    created: str = ""            # %Y-%m-%dT%H:%M:%S%z
    tuner: str = ""              # the version of the tool that created the run
    command: str = ""            # the command line, key flags redacted
    storage: str | None = None   # an Optuna storage URL that also keeps the study
    study_name: str = ""  # of the study --storage keeps (tuner.search.study); "": the run's id
    skeleton: dict | None = None  # {name, hash, template, space}: where the skeleton came from
    budget: int | None = None
    patience: int | None = None
    warm_start: tuple[str, ...] = ()    # run directories or landscapes of the same space
    backend_options: dict | None = None  # e.g. the sim's chip
    devices: tuple[int, ...] = ()        # device indices the run is bound to
    device: DeviceInfo | None = None     # the device, once measured
    retune_of: dict | None = None        # {run, backend, device, op, seeds}
    sweep: str | None = None             # the sweep a task belongs to
    rounds: int | None = None            # a multi-round run: its number of rounds
    proposer: dict | None = None         # a multi-round run: its skeleton writer (no key)
    round: int | None = None             # a round of a multi-round run
    parent_run: str | None = None        # that multi-round run's id
    other: dict = dataclasses.field(default_factory=dict)

    @property
    def is_rounds(self) -> bool:
        return self.rounds is not None

    def replace(self, **changes: Any) -> "RunMeta":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.other)
        for f in dataclasses.fields(self):
            if f.name == "other":
                continue
            v = getattr(self, f.name)
            if v is None or (v == () and f.name in ("warm_start", "devices")):
                continue
            out[f.name] = v.to_json() if hasattr(v, "to_json") else list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunMeta":
        """Raises ValueError naming the key when a known key holds the wrong kind of value."""
        if not isinstance(data, dict):
            raise ValueError(f"a JSON object was expected, found a {type(data).__name__}")
        missing = [k for k in ("op", "backend") if k not in data]
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")
        known = {f.name for f in dataclasses.fields(cls)} - {"other"}
        kw: dict[str, Any] = {}
        for k, v in data.items():
            if k not in known or v is None:
                continue
            try:
                kw[k] = _META_READERS.get(k, _same)(v)
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                raise ValueError(f"its {k!r} is not what a run keeps there ({e!r})") from None
        kw.setdefault("id", "")
        other = {k: v for k, v in data.items() if k not in known and k != "format_version"}
        return cls(**kw, other=other)


def _same(v: Any) -> Any:
    return v


def _typed(kind: type) -> Any:
    def read(v: Any) -> Any:
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise TypeError(f"{kind.__name__} expected, found {type(v).__name__}")
        return v
    return read


_META_READERS = {
    "id": _typed(str), "op": OpSpec.from_json, "backend": _typed(str), "sampler": _typed(str),
    "seed": _typed(int), "created": _typed(str), "tuner": _typed(str), "command": _typed(str),
    "storage": _typed(str), "study_name": _typed(str), "skeleton": _typed(dict),
    "budget": _typed(int), "patience": _typed(int),
    "warm_start": lambda v: tuple(str(s) for s in _typed(list)(v)),
    "backend_options": _typed(dict), "devices": lambda v: tuple(int(i) for i in _typed(list)(v)),
    "device": DeviceInfo.from_json, "retune_of": _typed(dict), "sweep": _typed(str),
    "rounds": _typed(int), "proposer": _typed(dict), "round": _typed(int), "parent_run": _typed(str),
}
