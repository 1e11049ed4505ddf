"""How a rendered Triton module is loaded and warmed (the cuda, npu and sim backends).

What such a module may contain is `tuner.codecheck.python`'s contract; `load_module` checks
the file again before it imports it (the file could have changed since it was compiled).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

from tuner.codecheck import require_clean


def use_cache(kernel_path: Path) -> None:
    """One Triton cache per run (`<run>/build/triton_cache`), shared by the compile pool and the
    benchmark worker: the worker's first launch of a kernel is a hit on what a compile built."""
    cache = Path(kernel_path).resolve().parent.parent / "triton_cache"
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(cache)


def load_module(path: str | Path, name: str, language: str = "triton"):
    """Import a module file under `name`, checked first as a `language` source; raises
    `codecheck.Forbidden` or SyntaxError when it breaks the contract."""
    path = Path(path)
    require_clean(language, path.read_text())
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # @triton.jit looks its function's module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def warm_launch(module, inputs: list, outputs: list) -> list:
    """Call the module's `launch` with every Triton kernel launch turned into a compile-only
    warm-up (`run(..., warmup=True)`); the compiled kernels, in launch order. The compile
    happens in the compile pool, and the benchmark worker's first launch hits the cache."""
    import torch
    from triton.runtime import jit
    compiled: list = []
    original = jit.JITFunction.run

    def run(fn, *args, grid, warmup, **kwargs):
        kernel = original(fn, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        return kernel

    jit.JITFunction.run = run
    try:
        with torch.no_grad():
            module.launch(*inputs, *outputs)
    finally:
        jit.JITFunction.run = original
    return compiled


@contextlib.contextmanager
def compile_only(backend: str, arch, warp_size: int):
    """Point Triton at a stand-in driver that names the target (`GPUTarget(backend, arch,
    warp_size)`: "cuda" with the SM number, or triton-ascend's "npu" with the SoC name) and
    owns no device context: the device and stream a compile-only launch asks for are 0, which
    it never uses. A compile process then never opens a GPU or an NPU."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class CompileOnly:
        def get_current_target(self):
            return GPUTarget(backend, arch, warp_size)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    previous = getattr(driver, "_active", None)
    driver.set_active(CompileOnly())
    try:
        yield
    finally:
        if hasattr(driver, "_active"):
            driver._active = previous  # no real driver left behind: it would want the device
        else:
            driver.reset_active()
