"""CUDA C++ kernels in a `cuda` launch module: what such a module calls, and nothing else.

A `cuda` skeleton (cuda backend, language `cuda`) renders a Python module of constants and
`def launch(<inputs>, <outputs>)`, checked like a Triton one (`tuner.codecheck.python`, policy
CUDA), whose launch calls

    cuda.launch(SOURCE, "kernel_name", grid, block, *args, smem=0, options=OPTIONS)

with `SOURCE` a module constant of CUDA C++ (`extern "C" __global__` functions: their names
stay as written), `grid` and `block` up to three ints, `args` tensors (passed as device
pointers) and Python numbers (typed by the kernel's own parameters: int, unsigned, float,
double of the widths the kernel declares), `smem` the dynamic shared memory in bytes and
`options` compile options from `tuner.backends.cuda_source.OPTIONS`. A kernel that reads a
tensor with the Tensor Memory Accelerator (sm_90+: `cp.async.bulk.tensor`) is passed

    cuda.tensor_map(t, box, swizzle=0)

for a parameter `const __grid_constant__ TensorMap m` (a 64-byte-aligned 128-byte struct): a
tiled descriptor of the tensor `t` itself (its pointer, shape and strides, so the copies it
drives stay inside `t`; reads past its edges are zeros), `box` the tile one copy moves (a size
per dimension, outermost first), `swizzle` 0, 32, 64 or 128 (bytes: the shared-memory
layout CU_TENSOR_MAP_SWIZZLE_<n>B, which spreads a column of rows over the banks).

Why Python around CUDA C++ and not a C++ host launcher: host C++ compiled into the process
that holds the device could call anything (the CUDA runtime's copies, cuBLAS, the system); the
launch module runs under the Python checks and the no-host-compute dispatch mode, and only
device code is compiled (to a cubin, ahead of timing, in the compile workers). The kernels
are the op's work; the module only says how to launch them.

Contract for the harness:
* `recording()`: in a compile worker, `launch` records each call (`Launch`) instead of
  running it; `launch` is called there on meta tensors (shapes and dtypes, no data).
* `load_units(manifest_dir, manifest)`: in the benchmark worker, the compiled units of one
  kernel module loaded into this process (CUDA driver API); `launch` then finds its kernel by
  (source, options) and launches it on torch's current stream. A source that was not compiled
  ahead is an error, never compiled here.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
from dataclasses import dataclass, field
from typing import Any

# ---- what a launch module calls ---------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    """Ceiling division, for grids."""
    return -(-a // b)


@dataclass(frozen=True, eq=False)
class TensorMap:
    """A TMA descriptor of one tensor, made by `tensor_map`; encoded on the GPU's side at the
    launch that passes it (see the module docstring)."""
    tensor: Any = field(repr=False)
    box: tuple[int, ...] = ()
    swizzle: int = 0


# torch dtype name -> CUtensorMapDataType
_TMA_DTYPES = {"uint8": 0, "int8": 0, "int16": 1, "uint16": 1, "int32": 3, "uint32": 2, "int64": 5,
               "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
_TMA_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # bytes -> CUtensorMapSwizzle


def tensor_map(t, box, swizzle: int = 0) -> TensorMap:
    """A TMA descriptor of tensor `t` moving `box`-shaped tiles (outermost dimension first)
    into shared memory laid out by `swizzle`; raises ValueError naming what the hardware
    would refuse."""
    box = tuple(box) if isinstance(box, (tuple, list)) else (box,)
    why = _tensor_map_problem(t, box, swizzle)
    if why:
        raise ValueError(f"cuda.tensor_map: {why}")
    return TensorMap(t, box, swizzle)


def _tensor_map_problem(t, box, swizzle) -> str | None:
    if not (hasattr(t, "data_ptr") and hasattr(t, "dtype") and hasattr(t, "stride")):
        return f"a tensor is described, not a {type(t).__name__}"
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in _TMA_DTYPES:
        return f"dtype {dtype} has no TMA element type"
    if swizzle not in _TMA_SWIZZLE:
        return f"swizzle={swizzle!r}: one of 0, 32, 64, 128 (bytes)"
    rank = t.dim()
    if not 1 <= rank <= 5:
        return f"a tensor of rank {rank}: TMA describes 1 to 5 dimensions"
    if len(box) != rank or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 256 for b in box):
        return f"box={box!r}: one int in 1..256 per dimension of the {rank}-d tensor"
    size = t.element_size()
    if t.stride(-1) != 1:
        return "the innermost dimension must be contiguous (stride 1)"
    if any((t.stride(d) * size) % 16 for d in range(rank - 1)):
        return "every outer stride must be a multiple of 16 bytes"
    inner = box[-1] * size
    if inner % 16:
        return f"the box's innermost extent is {inner} bytes: a multiple of 16"
    if swizzle and inner > swizzle:
        return f"the box's innermost extent ({inner} bytes) exceeds the swizzle span ({swizzle} bytes)"
    return None


def launch(source: str, name: str, grid, block, *args, smem: int = 0, options=()) -> None:
    """Launch the `__global__` function `name` of the CUDA C++ `source` (see the module
    docstring)."""
    grid, block = _dims(grid, "grid"), _dims(block, "block")
    if not isinstance(smem, int) or smem < 0:
        raise ValueError(f"smem={smem!r}: the dynamic shared memory is a byte count >= 0")
    options = tuple(options)
    key = unit_key(source, options)
    if _recording is not None:
        _recording.append(Launch(source, options, key, str(name), grid, block, smem,
                                 tuple(_kind(a) for a in args)))
        return
    kernel = _kernels.get((key, name))
    if kernel is None:
        if not any(k == key for k, _ in _kernels):
            raise RuntimeError("cuda.launch: this source was not compiled ahead of the launch (the source "
                               "and options must be the module's constants, the same on every call)")
        raise RuntimeError(f"cuda.launch: the source has no __global__ function {name!r}")
    kernel(grid, block, smem, args)


# ---- compile side: what a launch module asked for --------------------------------------


@dataclass(frozen=True)
class Launch:
    """One `launch` call seen on meta tensors: what to compile and how it will be launched."""
    source: str
    options: tuple[str, ...]
    key: str                       # unit_key(source, options)
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[str, ...]          # per argument: "tensor:<dtype>", "int", "float", "bool"


_recording: list[Launch] | None = None


@contextlib.contextmanager
def recording():
    """Within: `launch` records its calls into the yielded list instead of launching."""
    global _recording
    previous, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = previous


def unit_key(source: str, options: tuple[str, ...]) -> str:
    """The compiled unit a (source, options) pair is: the name of its cubin in a manifest."""
    memo = _key_memo.get(id(source))
    if memo is not None and memo[0] is source and memo[1] == options:
        return memo[2]
    key = hashlib.sha256(("\0".join(options) + "\0\0" + source).encode()).hexdigest()[:24]
    _key_memo[id(source)] = (source, options, key)
    return key


_key_memo: dict[int, tuple[str, tuple, str]] = {}


def _dims(v, what: str) -> tuple[int, int, int]:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if not 1 <= len(t) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) for d in t):
        raise ValueError(f"{what}={v!r}: one to three ints")
    if any(d < 1 for d in t):
        raise ValueError(f"{what}={v!r}: every dimension must be at least 1 (an empty {what} launches nothing)")
    return (*t, *(1,) * (3 - len(t)))


def _kind(a) -> str:
    if isinstance(a, TensorMap):
        return "tensormap"
    if hasattr(a, "data_ptr") and hasattr(a, "dtype"):
        return f"tensor:{str(a.dtype).removeprefix('torch.')}"
    if isinstance(a, bool):
        return "bool"
    if isinstance(a, int):
        return "int"
    if isinstance(a, float):
        return "float"
    raise TypeError(f"cuda.launch: an argument of type {type(a).__name__}; pass tensors, tensor maps, ints and floats")


# ---- device side: compiled units loaded through the CUDA driver --------------------------

# PTX parameter types -> the ctypes value a Python number is passed as.
_CTYPES = {"u8": ctypes.c_uint8, "s8": ctypes.c_int8, "b8": ctypes.c_uint8,
           "u16": ctypes.c_uint16, "s16": ctypes.c_int16, "b16": ctypes.c_uint16,
           "u32": ctypes.c_uint32, "s32": ctypes.c_int32, "b32": ctypes.c_uint32,
           "u64": ctypes.c_uint64, "s64": ctypes.c_int64, "b64": ctypes.c_uint64,
           "f32": ctypes.c_float, "f64": ctypes.c_double}
_POINTER_SLOTS = (ctypes.c_uint64, ctypes.c_int64)  # the types a tensor's pointer is passed as
TENSOR_MAP_PARAM = "b8[128]@64"  # a TensorMap's parameter as `ptx_entries` writes it
_MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

_kernels: dict[tuple[str, str], "_Kernel"] = {}
_modules: dict[str, int] = {}  # unit key -> CUmodule, loaded once per process


def check_arg(ptx_type: str, kind: str) -> str | None:
    """Why an argument of `kind` cannot be passed as a parameter of `ptx_type`, or None."""
    if kind == "tensormap":
        return None if ptx_type == TENSOR_MAP_PARAM else (
            f"a tensor map (cuda.tensor_map) for a parameter of type .{ptx_type}: declare it "
            "`const __grid_constant__ TensorMap m` with `struct alignas(64) TensorMap { unsigned long long v[16]; };`")
    if ptx_type == TENSOR_MAP_PARAM:
        return f"a {kind.split(':')[0]} for a tensor map's parameter (128 bytes, 64-aligned): pass cuda.tensor_map(...)"
    if ptx_type not in _CTYPES:
        return f"a parameter of PTX type .{ptx_type} (structs and arrays by value are not supported)"
    if kind.startswith("tensor"):
        return None if ptx_type[1:] == "64" and ptx_type[0] != "f" else \
            f"a tensor (a 64-bit device pointer) for a parameter of type .{ptx_type}"
    if kind == "float":
        return None if ptx_type[0] == "f" else f"a Python float for an integer parameter (.{ptx_type})"
    return None if ptx_type[0] != "f" else f"a Python {kind} for a floating-point parameter (.{ptx_type})"


class _Kernel:
    """One loaded `__global__` function and its parameter types. A call is on the host path of
    every routed call in a served model, which a launch-bound forward (a decode step) feels in
    full: what can be decided once per kernel is (each parameter's ctypes type), and a call
    only reads its arguments' pointers and the current stream (torch's raw stream lookup, not
    `torch.cuda.current_stream()`, which builds a Stream object each time)."""

    def __init__(self, func: int, name: str, params: list[str]) -> None:
        self.func, self.name, self.params = func, name, params
        self.types = [_CTYPES.get(t) for t in params]
        self.smem_set = 48 * 1024  # dynamic shared memory allowed without asking

    def __call__(self, grid, block, smem: int, args) -> None:
        import torch
        if len(args) != len(self.params):
            raise TypeError(f"cuda.launch({self.name!r}): {len(args)} arguments for {len(self.params)} parameters")
        values = []
        for i, (a, t, c) in enumerate(zip(args, self.params, self.types)):
            if isinstance(a, torch.Tensor):
                why = None if c in _POINTER_SLOTS else check_arg(t, _kind(a))
                if why is None and not a.is_cuda:
                    why = f"a tensor on {a.device}, not the GPU"
                if why is None:
                    values.append(c(a.data_ptr()))
                    continue
            elif isinstance(a, TensorMap):
                why = check_arg(t, "tensormap") or _encode_problem(a)
                if why is None:
                    values.append(_encode(a))
                    continue
            else:
                why = check_arg(t, _kind(a))
                if why is None and c is not None and not isinstance(a, (int, float)):
                    why = f"a {type(a).__name__}; pass torch tensors, ints and floats"
                if why is None:
                    values.append(c(a))
                    continue
            raise TypeError(f"cuda.launch({self.name!r}) argument {i}: {why}")
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        drv = _driver()
        if smem > self.smem_set:
            _check(drv.cuFuncSetAttribute(ctypes.c_void_p(self.func), _MAX_DYNAMIC_SMEM, smem), "cuFuncSetAttribute")
            self.smem_set = smem
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        _check(drv.cuLaunchKernel(ctypes.c_void_p(self.func), *grid, *block, smem, ctypes.c_void_p(stream),
                                  params, None), f"launch of {self.name!r}")


_encoded: dict[tuple, Any] = {}  # descriptors by what they describe: buffers rotate, shapes repeat


def _encode_problem(m: TensorMap) -> str | None:
    t = m.tensor
    why = _tensor_map_problem(t, m.box, m.swizzle)  # again: the map may not come from tensor_map
    if why:
        return f"a tensor map: {why}"
    if not t.is_cuda:
        return f"a tensor map of a tensor on {t.device}, not the GPU"
    if t.data_ptr() % 16:
        return "a tensor map of a tensor whose address is not 16-byte aligned"
    return None


def _encode(m: TensorMap):
    """The 128-byte CUtensorMap of `m` (cuTensorMapEncodeTiled), cached by what it describes."""
    t = m.tensor
    key = (t.data_ptr(), str(t.dtype), tuple(t.shape), tuple(t.stride()), m.box, m.swizzle)
    value = _encoded.get(key)
    if value is not None:
        return value
    rank, size = t.dim(), t.element_size()
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    dims = (u64 * rank)(*reversed(t.shape))                               # innermost first
    strides = (u64 * max(rank - 1, 1))(*[t.stride(d) * size for d in reversed(range(rank - 1))])
    box = (u32 * rank)(*reversed(m.box))
    ones = (u32 * rank)(*[1] * rank)
    value = (u64 * 16)()
    _check(_driver().cuTensorMapEncodeTiled(
        ctypes.byref(value), _TMA_DTYPES[str(t.dtype).removeprefix("torch.")], rank, ctypes.c_void_p(t.data_ptr()),
        dims, strides, box, ones, 0, _TMA_SWIZZLE[m.swizzle], 2, 0), "cuTensorMapEncodeTiled")
    if len(_encoded) >= 256:
        _encoded.clear()
    _encoded[key] = value
    return value


def load_units(units: dict[str, dict[str, Any]], read_cubin) -> None:
    """Load compiled units (manifest entries: key -> {"kernels": {name: {"params": [...]}}})
    into this process; `read_cubin(key) -> bytes`. The current device's context is torch's
    (made current before this is called)."""
    import torch
    torch.cuda.current_stream()  # torch's primary context, current on this thread
    drv = _driver()
    for key, unit in units.items():
        if key not in _modules:
            module = ctypes.c_void_p()
            data = read_cubin(key)
            _check(drv.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(data)), "loading a compiled kernel")
            _modules[key] = module.value
        for name, info in unit["kernels"].items():
            if (key, name) in _kernels:
                continue
            func = ctypes.c_void_p()
            _check(drv.cuModuleGetFunction(ctypes.byref(func), ctypes.c_void_p(_modules[key]), name.encode()),
                   f"finding {name!r} in its compiled unit")
            _kernels[(key, name)] = _Kernel(func.value, name, list(info["params"]))


_lib = None


def _driver():
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") from None
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 6, ctypes.c_uint, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _lib = lib
    return _lib


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _lib.cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"CUDA error in {what}: {(name.value or b'?').decode()} ({result})")


__all__ = ["launch", "cdiv", "tensor_map"]
