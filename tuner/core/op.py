"""The live operator (`Op`) and the dtype tables every op kind shares: what `tuner.core.ops`
(built-in ops) and `tuner.core.problem` (KernelBench-format problem files) both build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tuner.core.values import OpSpec

DTYPES = ("fp32", "fp64", "fp16", "bf16")
DTYPE_BYTES = {"fp32": 4, "fp64": 8, "fp16": 2, "bf16": 2}
# |out - ref| <= atol + rtol * |ref|, reference computed in float64.
TOLERANCE = {"fp64": (1e-10, 1e-10), "fp32": (1e-5, 1e-5), "fp16": (1e-3, 1e-2), "bf16": (1e-2, 1e-2)}


class OpError(ValueError):
    """An op that cannot be used: unknown name, bad shape, a problem file that fails."""


def torch_dtype(name: str):
    import torch
    return {"fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16,
            "bf16": torch.bfloat16}[name]


@dataclass
class Op:
    """A live operator. Inputs are made fresh per seed; outputs are compared in float64."""

    spec: OpSpec
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    make_inputs: Callable[..., list]  # (seed, device=None) -> tensors in the op's dtype, there
    reference: Callable[[list], list]  # float64 inputs -> float64 outputs
    torch_impl: Callable[[list], list]  # inputs in the op's dtype -> outputs (what users run today)
    flops: float | None
    bytes: float
    tolerance: tuple[float, float]
    # The inputs and parameters as a caller passes them -> outputs, computed with those
    # parameters (`tuner.runtime`'s fallback); None: `torch_impl` does (a built-in op's
    # weights are inputs already). A problem file's `torch_impl` runs its Model's own
    # parameters, which is what the timing compares against, but not what a user passed.
    torch_call: Callable[[list], list] | None = None
    # More names the template and the space's expressions may read (a problem file's
    # get_init_inputs() numbers, `problem.init_context`).
    context: tuple[tuple[str, Any], ...] = ()

    @property
    def sizes(self) -> dict[str, int]:
        return self.spec.size_dict()


# ---- built-in ops -----------------------------------------------------------------------
