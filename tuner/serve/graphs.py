"""A served kernel's launches on a GPU replayed as CUDA graphs (`LaunchGraphs`), for
`tuner.serve.kernel.Kernel`: the host time of a launch module, paid per call, down to a few us.
"""

from __future__ import annotations

import threading
from typing import Any

from tuner.core.settings import Settings


class LaunchGraphs:
    """A kernel's launches on a GPU, replayed as CUDA graphs, one per buffer set.

    Why: a launch module's host side (Triton's launcher, the arguments' packing) costs 15-40 us
    a call on a loaded host, more than the small kernels of a decode step take on the device
    (bench/RESULTS.md); replaying a graph of the same launch costs a few. A graph holds its
    launch's pointers and what the launch module computed from the tensors' shapes (grids,
    strides, TMA descriptors), never from their data (a launch module cannot read it:
    tuner.codecheck), so a replay on the same buffers is the same launch: the key is each
    argument's data pointer (the shapes and dtypes are the kernel's, checked before the launch).
    A buffer set is captured on its second call (one seen once, a prefill of a new length, costs
    no capture), while the kernel's graphs have paid for their captures: beyond the first FREE,
    one capture per PAYBACK replays of the graphs before it. A capture costs the host 0.2-1.3
    ms, what tens of replays save over direct launches (5-26 us each on the H100 hosts measured,
    bench/RESULTS.md); a kernel whose buffer sets rarely come back (per-forward tensors such as
    a rope's cos and sin halves, an output the allocator places anew) would otherwise capture on
    most calls and launch slower than directly. At most MAX graphs a kernel, the least recently
    used dropped. Launched directly instead: while the caller captures a graph of its own, when
    the tensors are not on the current device, and for good once a capture fails (`off` says
    why). Settings.serve_graphs (TUNER_SERVE_GRAPHS=0) turns them off."""

    MAX = 64  # graphs kept per kernel
    SEEN = 1024  # buffer sets remembered from a first call
    FREE = 2  # captures made before any replay
    PAYBACK = 16  # replays that earn one more capture

    def __init__(self, launch):
        from collections import OrderedDict
        self._launch = launch  # args -> None: the backend's direct launch
        self._graphs: OrderedDict[tuple, Any] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._stream = None
        self._lock = threading.Lock()
        self._capturing = threading.Lock()
        self.off: str | None = None
        self.captured = 0
        self.replays = 0  # of graphs captured on an earlier call

    @classmethod
    def of(cls, kernel):
        """The kernel's graphs, or False where it runs on no GPU or the setting is off."""
        import torch
        if kernel._device is None:
            kernel._device = kernel.backend.to_device(torch.empty(0)).device
        if kernel._device.type != "cuda" or not Settings.from_env().serve_graphs:
            return False
        return cls(lambda args: kernel.backend.launch(kernel.fn, args))

    def __call__(self, args: list) -> None:
        import torch
        if torch.cuda.is_current_stream_capturing() or args[0].device.index != torch.cuda.current_device():
            return self._launch(args)  # a graph replays on the current device's stream
        key = tuple(a.data_ptr() for a in args)
        with self._lock:  # the books only (threads may share a kernel); the launches outside it
            g = self._graphs.get(key)
            if g is not None:
                self._graphs.move_to_end(key)
                self.replays += 1
            elif (self.off is not None or key not in self._seen
                  or self.captured >= self.FREE + self.replays // self.PAYBACK):
                self._seen[key] = None
                self._seen.move_to_end(key)
                if len(self._seen) > self.SEEN:
                    self._seen.popitem(last=False)
            else:
                del self._seen[key]
                g = False
        if g is None:
            return self._launch(args)
        if g is False:
            g = self._capture(args)
            if g is None:
                return self._launch(args)
            with self._lock:
                self._graphs[key] = g
                if len(self._graphs) > self.MAX:
                    self._graphs.popitem(last=False)
        g.replay()

    def _capture(self, args: list):
        """A graph of one launch on these buffers (captured, not run), or None (and `off`)."""
        import torch
        with self._capturing:
            g = torch.cuda.CUDAGraph()
            if self._stream is None:
                self._stream = torch.cuda.Stream(args[0].device)
            self._stream.wait_stream(torch.cuda.current_stream(args[0].device))
            try:
                with torch.cuda.stream(self._stream):
                    g.capture_begin(capture_error_mode="thread_local")
                    try:
                        self._launch(args)
                    finally:
                        g.capture_end()
            except Exception as e:  # noqa: BLE001 - whatever stops a capture: launch directly from now on
                self.off = f"{type(e).__name__}: {str(e)[:200]}"
                return None
            torch.cuda.current_stream(args[0].device).wait_stream(self._stream)
            self.captured += 1
            return g
