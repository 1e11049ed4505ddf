"""The `null` backend: a deterministic fake device that runs the whole pipeline anywhere.

A null skeleton's template renders to a few `key: value` lines that script what happens:

    time: 1.5e-4          # the seconds each timed call reports (deterministic)
    fault: crash          # optional: compile_error | compile_hang | crash | hang | wrong | nan

The kernel itself computes the op's reference (so verification passes) unless a fault says
otherwise; `crash` kills the worker with SIGSEGV and `hang` never returns, exactly like a
broken real kernel.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

from tuner.backends.base import Backend
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

FAULTS = {"compile_error", "compile_hang", "crash", "hang", "wrong", "nan", "none"}


def parse_script(source: str) -> dict[str, str]:
    """The `key: value` lines; a line that is neither, or an unknown key, is a compile error."""
    out = {}
    for n, line in enumerate(source.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep or k.strip() not in ("time", "fault"):
            raise ValueError(f"line {n}: expected 'time: <seconds>' or 'fault: <kind>', got {line!r}")
        out[k.strip()] = v.strip()
    return out


class NullBackend(Backend):
    name = "null"
    language = "script"

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        self._time = 1e-3
        # The fake kernel's work is a small torch copy; torch's thread pool only contends for
        # the cores (seen: 0.04 s a measurement with one thread, up to 1.2 s with all).
        import torch
        torch.set_num_threads(1)

    def render_context(self, op) -> dict[str, Any]:
        return {"CORES": 4}

    def limits(self) -> dict[str, float]:
        return {"smem_bytes": 49152}

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        try:
            script = parse_script(source)
        except ValueError as e:
            return Build(Status.COMPILE_ERROR, error=f"null: error: {e}")
        fault = script.get("fault", "none")
        if fault not in FAULTS:
            return Build(Status.COMPILE_ERROR, error=f"unknown fault {fault!r}; one of {sorted(FAULTS)}")
        try:
            seconds = float(script.get("time", "1e-3"))
        except ValueError:
            return Build(Status.COMPILE_ERROR, error=f"time: {script.get('time')!r} is not a number")
        if not (0 < seconds < float("inf")):  # a zero time would make every rate divide by zero
            return Build(Status.COMPILE_ERROR, error=f"time: {script.get('time')!r} must be a positive "
                                                     f"number of seconds")
        if fault == "compile_error":
            return Build(Status.COMPILE_ERROR, error="null: scripted compile error\n  error: expected ';'")
        if fault == "compile_hang":
            while True:
                time.sleep(1)
        path = Path(workdir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "kernel.txt").write_text(source)
        return Build(Status.OK, artifact=str(path / "kernel.txt"), compile_s=0.0,
                     binary_hash=hashlib.sha256(source.encode()).hexdigest()[:16])

    def device_info(self, peaks: bool = True) -> DeviceInfo:  # nothing measured either way
        return DeviceInfo(backend="null", name="null device", cores=4,
                          limits=tuple(self.limits().items()),
                          peaks=(("copy_gbps", 100.0), ("fp32_gflops", 1000.0)),
                          toolchain=(("null", "1"),), simulated=True)

    def load(self, artifact: str, op) -> Any:
        script = parse_script(Path(artifact).read_text())
        fault = script.get("fault", "none")

        memo: dict = {}

        def kernel(args: list) -> None:
            self._time = kernel.seconds
            if fault == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == "hang":
                while True:
                    time.sleep(1)
            n_in = len(op.input_names)
            key = tuple((a.data_ptr(), a._version, tuple(a.flatten()[:8].tolist()), tuple(a.flatten()[-8:].tolist())) for a in args[:n_in])
            if memo.get("key") != key:  # timing repeats one input set: compute it once
                xs = [a.double() if a.is_floating_point() else a for a in args[:n_in]]
                memo["key"], memo["refs"] = key, op.reference(xs)
            for out, ref in zip(args[n_in:], memo["refs"]):
                if fault == "nan":
                    continue  # leaves the poisoned NaNs: "did not write its output"
                out.copy_(ref + (1.0 if fault == "wrong" else 0.0))
        kernel.seconds = float(script.get("time", "1e-3"))
        return kernel

    def launch(self, kernel: Any, args: list) -> None:
        kernel(args)

    def sandbox(self) -> str:
        return "kernel process: none (no candidate code runs on this backend)"

    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        if before is not None:
            before()
        fn()  # sets self._time to the scripted time of the kernel it launches
        return self._time
