"""One settings object. Defaults here; each can be set by a TUNER_<NAME> environment variable
(e.g. TUNER_RUN_TIMEOUT_S=120) and most by a command-line flag."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from pathlib import Path


def _default_cache() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuner")


def _flag(text: str) -> bool:
    """A yes/no setting from the environment (bool("0") would be True)."""
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


@dataclass(frozen=True)
class Settings:
    runs_dir: str = "runs"
    cache_dir: str = dataclasses.field(default_factory=_default_cache)
    compile_timeout_s: float = 60.0
    run_timeout_s: float = 60.0  # verify + time one candidate; a hang is killed after this
    bench_budget_s: float = 0.25  # timed repetitions per candidate, sized from an estimate
    warmup_s: float = 0.02
    min_reps: int = 5
    max_reps: int = 2000
    # Stop timing a candidate once its median is known this closely (standard error of the
    # median over the median; 0: always the whole bench_budget_s). The top few are re-timed
    # interleaved on the whole budget before a winner is named, so this only ranks the search.
    precision: float = 0.003
    early_stop_factor: float = 1.5  # stop timing a candidate once its median (of min_reps or more) is this x the best
    # Before the winner is named, the fastest `retime_top` distinct kernels, and every other
    # whose search-time median is within the noise of the best (`retime_margin`, or more where
    # the timings' own spread says so), up to `retime_max`, are re-timed interleaved: medians
    # taken minutes apart differ by drift that one interleave does not have.
    retime_top: int = 3
    retime_margin: float = 0.05
    retime_max: int = 8
    # During the search, a config timed faster than the incumbent, or slower by less than twice
    # the drift the search has measured between evaluations (`winner.drift_margin`: 6 % until
    # measured, 1-10 %), is timed again with it in one interleave, and the search is told the
    # incumbent's figure times their ratio there (see `tune.run_search`): a new best that was
    # only drift does not become where it walks on from, and a faster config that drift made
    # look slower is not written off.
    # "auto": on the accelerators (cuda, npu), where such a re-timing costs two kernels' timed
    # calls; off on the cpu backend, where each timed call flushes the caches (it doubled a
    # 40-evaluation run there) and on the simulated ones; "on" / "off" force it.
    anchor: str = "auto"
    suspect_speedup: float = 10.0  # faster than this x the reference: re-verify before trusting
    # The physics check: a kernel faster than moving the op's bytes at this x the measured copy
    # bandwidth (or its FLOPs at this x the fastest measured matmul rate) is SUSPECT, never OK.
    # Above 1 because a measured peak is a torch copy or matmul, not the hardware's own figure.
    floor_margin: float = 2.0
    compile_workers: int = 0  # 0: one per CPU core
    worker_memory_gb: float = 0.0  # 0: three quarters of the machine's memory
    worker_cpu_s: int = 600  # CPU seconds (all threads) one compile or measure request may use
    report: bool = True  # write report.html (tuner.run.html) into each run directory at its end
    # With --patience: a stall stops the search only once the guided model also expects less
    # than this fraction from the configs it weighed last ("good enough"); 0: the stall alone.
    stop_gain: float = 0.0
    # The runtime replays a served kernel's launch on a buffer set it has seen as a CUDA graph
    # (tuner.serve.graphs.LaunchGraphs): the launch's host time, paid per call, down to a few us.
    serve_graphs: bool = True

    def anchors(self, backend: str) -> bool:
        """Whether a search on `backend` anchors new bests (see `anchor`)."""
        if self.anchor not in ("auto", "on", "off"):
            raise ValueError(f"TUNER_ANCHOR={self.anchor!r}: one of auto, on, off")
        return self.anchor == "on" or (self.anchor == "auto" and backend in ("cuda", "npu"))

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        values = {}
        for f in fields(cls):
            env = os.environ.get("TUNER_" + f.name.upper())
            if env is not None:
                kind = type(getattr(cls(), f.name))
                try:
                    values[f.name] = _flag(env) if kind is bool else kind(env)
                except ValueError:
                    raise ValueError(f"TUNER_{f.name.upper()}={env!r} is not a valid {kind.__name__}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)

    @property
    def n_compile_workers(self) -> int:
        return self.compile_workers or max(1, os.cpu_count() or 1)

    def worker_memory_bytes(self) -> int:
        if self.worker_memory_gb > 0:
            return int(self.worker_memory_gb * 2**30)
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = 16 * 2**30
        return int(total * 0.75)
