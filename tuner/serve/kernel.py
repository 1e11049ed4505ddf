"""A served kernel: one tuned config built for one (op, sizes, dtype), called with the op's inputs.

`tuner.serve.runtime.Table` picks the entry and builds it; a `Kernel` checks each call's inputs
against what it was built for (it trusts its pointers, so a shorter weight or an int tensor
would be read past or misread), copies views and misaligned buffers to what the harness handed
it when it was tuned, allocates the outputs unless `out=` gives them, and launches (through a
CUDA graph where that pays: `tuner.serve.graphs`). `verified_here` is the one check a config
borrowed from another shape gets before it serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.core.ops import arg_specs
from tuner.serve.graphs import LaunchGraphs


@dataclass
class Kernel:
    """A built kernel for one (op, sizes, dtype): call it with the op's inputs (on the device);
    it allocates the outputs unless `out=` gives them, launches, and returns them."""

    entry: dict
    sizes: dict[str, int]
    exact: bool
    distance: float
    backend: Any
    op: Any
    fn: Any
    _specs: tuple | None = field(default=None, repr=False)  # `ops.arg_specs`: made once
    _device: Any = field(default=None, repr=False)  # where the backend runs it
    _graphs: Any = field(default=None, repr=False)  # LaunchGraphs on a GPU, False elsewhere; made at the first launch

    @property
    def config(self) -> dict:
        return self.entry["config"]

    def mismatch(self, inputs) -> str | None:
        """Why these inputs are not what this kernel was built for (count, tensor, device, each
        input's shape and dtype); None when they are. The kernel trusts its pointers: handed a
        shorter weight or an int tensor, it reads past it or reads its bits as floats."""
        import torch
        names = self.op.input_names
        if len(inputs) != len(names):
            return f"{self.op.spec.name} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}"
        if self._device is None:
            self._device = self.backend.to_device(torch.empty(0)).device
        for (shape, dtype), name, x in zip(self.specs()[0], names, inputs):
            if not isinstance(x, torch.Tensor):
                return f"input {name} is a {type(x).__name__}, not a tensor"
            if x.device != self._device:  # a C kernel handed a GPU pointer would crash the process
                return f"input {name} is on {x.device}; this kernel runs on {self._device}"
            if tuple(x.shape) != shape or x.dtype != dtype:
                return (f"input {name} is {tuple(x.shape)} {x.dtype}; the kernel for these sizes "
                        f"takes {shape} {dtype}")
        return None

    def outputs(self, inputs) -> list:
        import torch
        return [torch.empty(shape, dtype=dtype, device=inputs[0].device) for shape, dtype in self.specs()[1]]

    def specs(self) -> tuple[list, list]:
        """(shape, dtype) of the inputs and the outputs, as the harness handed them to the kernel
        when it was tuned (`ops.arg_specs`: a built-in op's inputs made on the meta device, a
        problem file's get_inputs() run once on the host)."""
        if self._specs is None:
            self._specs = arg_specs(self.op)
        return self._specs

    def __repr__(self) -> str:  # the entry holds the kernel's whole source: not printed
        how = "exact sizes" if self.exact else f"nearest tuned sizes, distance {self.distance:.3g}"
        return (f"Kernel({self.op.spec.name} {self.sizes} {self.op.spec.dtype} on "
                f"{self.entry.get('backend', '?')}, config {self.config}, {how})")

    def __call__(self, *inputs, out=None):
        why = self.mismatch(inputs)
        if why:
            raise ValueError(f"{self.op.spec.name} {self.sizes}: {why}")
        return self._launch(inputs, out)

    def _launch(self, inputs, out=None):
        """Launch on inputs `mismatch` has passed."""
        # The kernel indexes its inputs as contiguous row-major arrays: a view (a transpose, a
        # strided slice) is copied first, or it would read the wrong elements. It was also
        # only ever handed buffers as aligned as an allocation: one that starts mid-element-run
        # (a flat view at an odd offset) is copied too, or 16-byte loads, TMA or a Triton
        # kernel specialized on aligned pointers would fault (a GPU's sticky error ends the
        # caller's process) or read wrong.
        inputs = [x.contiguous() if not x.is_contiguous() else x if _aligned(x) else x.clone() for x in inputs]
        if out is not None:
            import torch
            outs = [out] if isinstance(out, torch.Tensor) else list(out)  # one output: a tensor will do
            specs = self.specs()[1]
            if len(outs) != len(specs):
                raise ValueError(f"out= gives {len(outs)} tensors; {self.op.spec.name} has {len(specs)} outputs")
            for name, o, (shape, dtype) in zip(self.op.output_names, outs, specs):
                if (tuple(o.shape), o.dtype, o.device) != (shape, dtype, inputs[0].device) or not o.is_contiguous():
                    raise ValueError(f"out= {name} must be a contiguous {shape} {dtype} tensor on "
                                     f"{inputs[0].device}, got {tuple(o.shape)} {o.dtype} on {o.device}"
                                     + ("" if o.is_contiguous() else ", not contiguous"))
        else:
            outs = self.outputs(inputs)
        work = [o if _aligned(o) else o.new_empty(o.shape) for o in outs]  # a misaligned out= gets a copy
        if self._graphs is None:
            self._graphs = LaunchGraphs.of(self)
        if self._graphs:
            self._graphs(list(inputs) + work)
        else:
            self.backend.launch(self.fn, list(inputs) + work)
        for o, w in zip(outs, work):
            if w is not o:
                o.copy_(w)
        return outs[0] if len(outs) == 1 else tuple(outs)


ALIGN_BYTES = 64  # what a served kernel may assume of a buffer's start (the harness gives more)


def _aligned(t) -> bool:
    return t.data_ptr() % ALIGN_BYTES == 0 or t.numel() == 0


def verified_here(k: Kernel) -> bool:
    """Whether `k` computes its op at its sizes: one check on inputs drawn from a seed no one can
    know in advance (a fixed seed would let a kernel recognise the check's inputs and answer
    them alone), its float64 reference made only after the kernel returned (on a GPU a kernel
    can read any device memory: a reference made first could be found and copied). False also
    when it raises: a kernel that fails at these sizes does not serve them."""
    import random

    from tuner.exec import checks
    seed = random.SystemRandom().randrange(1, 2**31)
    try:
        # On the backend's data device where it has one (a GPU's): a host reference made the
        # outputs on the host, and a Triton kernel refused them.
        why, _, _ = checks.check_reference_after(k.backend, k.fn, k.op, seed)
    except Exception:  # noqa: BLE001
        return False
    return why is None
