"""A lazy registry of backends: name -> module path, imported on first use.

A backend whose optional dependency is missing fails with a message that says what to
install, instead of an ImportError when the tool starts.
"""

from __future__ import annotations

import importlib

from tuner.backends.base import Backend, BackendUnavailable

BACKENDS = {
    "cpu": ("tuner.backends.cpu", "CpuBackend", "a C compiler with OpenMP (gcc or clang)"),
    "null": ("tuner.backends.null", "NullBackend", "nothing"),
    "replay": ("tuner.backends.replay", "ReplayBackend", "nothing (a recorded landscape: python -m tuner.offline.replay)"),
    "cuda": ("tuner.backends.cuda", "CudaBackend", "Triton and a CUDA build of torch (pip install 'tuner[cuda]')"),
    "npu": ("tuner.backends.npu", "NpuBackend", "an Ascend NPU with CANN, torch_npu and triton-ascend (see README, 'Ascend')"),
    "sim": ("tuner.backends.sim", "SimBackend", "nothing (an analytical Ascend model; --chip picks the chip)"),
}

# Backends whose workers may not be confined to writing under the run folder and the caches
# (tuner/exec/sandbox.confine_writes), and why. Read before the backend's module is imported.
UNCONFINED_WRITES = {
    "npu": "CANN writes its logs and kernel_meta folders where it is configured to, outside the run",
}

# Folders beyond the run's and the caches that a backend's workers must write under, and why.
EXTRA_WRITE_DIRS = {
    # The CUDA driver writes to /proc/<pid> of every process that uses it: a worker's own entry
    # is always allowed, but the memory checker's target is a process of its own.
    "cuda": ("/proc",),
}


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        from tuner.core.ops import did_you_mean
        raise BackendUnavailable(f"unknown backend {name!r}{did_you_mean(name, BACKENDS)}; known: "
                                 f"{', '.join(BACKENDS)}")
    module, cls, needs = BACKENDS[name]
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise BackendUnavailable(f"backend {name!r} needs {needs}: {e}") from None
    return getattr(mod, cls)


def get_backend(name: str, device: int = 0, **options) -> Backend:
    cls = backend_class(name)
    cls.check_available()
    return cls(device, **options)


def default_backend() -> str:
    """The backend a plain `tuner tune` uses: an accelerator when one is usable, else cpu."""
    for name in ("npu", "cuda"):
        if name in BACKENDS:
            try:
                backend_class(name).check_available()
                return name
            except BackendUnavailable:
                continue
    return "cpu"


__all__ = ["Backend", "BackendUnavailable", "BACKENDS", "UNCONFINED_WRITES", "EXTRA_WRITE_DIRS", "backend_class", "get_backend",
           "default_backend"]
