"""The `replay` backend: answers evaluations from a recorded landscape instead of a device.

A replay skeleton (written by `python -m tuner.offline.replay skeleton LANDSCAPE --out DIR`) renders
each config into a small script:

    landscape: /abs/path/matmul_h200.json     # a landscape JSON, or a run directory
    shape: 4096x4096x4096                     # which of its shapes (JSON landscapes only)
    config: {"BM": 128, "BN": 256, ...}

`compile` looks the config up: a recorded compile failure comes back as that Build; anything
else compiles to an artifact holding the recorded outcome. The kernel then behaves as the
recorded one did: an OK config computes the op's reference (so verification passes) and every
timed call reports the recorded median; a recorded runtime failure (e.g. a shared-memory
overflow) raises at launch with the recorded message, so it becomes RUNTIME_ERROR; a wrong
result writes a wrong answer. A recorded hang (RUN_TIMEOUT) is replayed as a runtime error
rather than a real hang. A config missing from the landscape is a COMPILE_ERROR that says so.

Nothing here runs the recorded kernel: figures are the landscape's (device_info says
`simulated`), and the reference op is timed on the host for real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from tuner.backends.base import Backend
from tuner.core import landscape
from tuner.core.values import Build, Config, DeviceInfo, OpSpec, Status


class ReplayBackend(Backend):
    name = "replay"
    language = "script"

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self._time: float | None = None

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        try:
            script = landscape.parse_script(source)
            config = Config.of(script["config"])
        except (ValueError, TypeError) as e:
            return Build(Status.COMPILE_ERROR, error=f"replay: error: {e}")
        try:
            land = landscape.load_cached(script["landscape"], script.get("shape"))
        except landscape.LandscapeError as e:
            return Build(Status.COMPILE_ERROR, error=f"replay: error: {e}")
        outcome = land.lookup(config)
        if outcome is None:
            return Build(Status.COMPILE_ERROR, error=f"replay: {land.name} has no record of {config}")
        if outcome.status in (Status.COMPILE_ERROR, Status.COMPILE_TIMEOUT, Status.INVALID):
            return Build(outcome.status, error=outcome.detail or f"recorded {outcome.status.value}",
                         compile_s=outcome.compile_s)
        path = Path(workdir)
        path.mkdir(parents=True, exist_ok=True)
        artifact = path / "replay.json"
        artifact.write_text(json.dumps({"status": outcome.status.value, "seconds": outcome.seconds,
                                        "detail": outcome.detail, "landscape": land.name}))
        import hashlib
        return Build(Status.OK, artifact=str(artifact), compile_s=outcome.compile_s,
                     binary_hash=hashlib.sha256((land.name + config.key).encode()).hexdigest()[:16])

    def device_info(self, peaks: bool = True) -> DeviceInfo:  # nothing measured either way
        return DeviceInfo(backend="replay", name="replay of a recorded landscape", cores=1,
                          toolchain=(("replay", "1"),), simulated=True)

    def load(self, artifact: str, op) -> Any:
        rec = json.loads(Path(artifact).read_text())
        status = Status(rec["status"])
        memo: dict = {}

        def kernel(args: list) -> None:
            if status is not Status.OK and status is not Status.WRONG_RESULT:
                raise RuntimeError(f"replayed {status.value}: {rec.get('detail', '')}")
            self._time = kernel.seconds
            n_in = len(op.input_names)
            key = tuple((a.data_ptr(), a._version, tuple(a.flatten()[:8].tolist())) for a in args[:n_in])
            if memo.get("key") != key:  # timing repeats one input set: compute it once
                xs = [a.double() if a.is_floating_point() else a for a in args[:n_in]]
                memo["key"], memo["refs"] = key, op.reference(xs)
            for out, ref in zip(args[n_in:], memo["refs"]):
                out.copy_(ref + (1.0 if status is Status.WRONG_RESULT else 0.0))
        kernel.seconds = float(rec["seconds"]) if status is Status.OK else 1.0
        return kernel

    def launch(self, kernel: Any, args: list) -> None:
        kernel(args)

    def sandbox(self) -> str:
        return "kernel process: none (no candidate code runs on this backend)"

    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        if before is not None:
            before()
        self._time = None
        t0 = time.perf_counter()
        fn()
        if self._time is not None:  # a replayed kernel: its recorded time
            return self._time
        return time.perf_counter() - t0  # anything else (the reference op) really runs here
