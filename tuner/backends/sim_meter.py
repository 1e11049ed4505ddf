"""What a Triton kernel moves, counted by running a few of its programs through Triton's
interpreter: the simulator's check of a module's ASCEND_COST against the kernel itself.

The sim backend's time is a model of the costs a module declares (sim.py); a declaration is
the candidate's own word, and a kernel that declares less than it moves would be modelled
faster than it is. `meter` runs the module's `launch` on the op's real arguments with only a
sample of each launch's programs executed (the first, the last and others drawn at random; the
others return at once), or all of them, and counts per program:

* the bytes every load and store moves (masked-off lanes excluded; descriptor loads and
  stores and atomics included) and the calls that move them (a call with no lane on: none);
* the dot products' multiply-adds (2 m n k per `tl.dot`);
* the float element-operations (`VECTOR_OPS`: arithmetic, math functions, min/max; each its
  result's elements), a lower bound of the vector work (reductions are numpy's, not counted);
* every other builder operation's result elements (index and mask arithmetic, compares,
  casts): each also checks the time budget, so a program that loops without loading is
  stopped too;
* the element-wise operations made (float or not; each reduction and scan one too) and the
  loads, stores and dots made: a loop of scalar arithmetic is many operations of one element
  each.

Contract: `meter(launch, args, programs, budget_s) -> Traffic` (`audit` meters every program
within a budget, in batches drawn at random). The arguments are the
candidate's to write: pass copies. A program the interpreter cannot finish within `budget_s`
(a persistent grid's program at a large shape: minutes of interpretation) is stopped there:
the counts are then what it did so far (`Traffic.complete` False), lower bounds that still
refuse a declaration they already exceed. Needs the interpreter (TRITON_INTERPRET=1 before Triton is imported) and raises
MeterUnavailable when this Triton's interpreter lacks what it hooks: the tool's failure, never
the kernel's. A kernel's own exception propagates.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from typing import Any, Callable


class MeterUnavailable(RuntimeError):
    """This Triton's interpreter cannot be metered (its internals are not the ones hooked)."""


@dataclass
class ProgramTraffic:
    """What one program moved: bytes and calls of loads and stores, dot flops."""
    load_bytes: int = 0
    store_bytes: int = 0
    loads: int = 0
    stores: int = 0
    dot_flops: float = 0.0
    vector_ops: int = 0  # float element-operations (arithmetic, math functions, min/max), reductions not counted
    other_ops: int = 0  # every other operation's result elements (index and mask arithmetic, casts, ...)
    op_calls: int = 0  # element-wise operations made (index, mask and float arithmetic): a scalar loop's are many
    move_calls: int = 0  # loads and stores with a lane on, and dots: the work op_calls serve

    @property
    def bytes(self) -> int:
        return self.load_bytes + self.store_bytes

    @property
    def transfers(self) -> int:
        return self.loads + self.stores


@dataclass
class Traffic:
    """Per metered program ((kernel name, grid index) -> ProgramTraffic) and each launch's grid;
    `complete`: every sampled program ran to its end (not stopped by the time budget)."""
    programs: dict[tuple[str, tuple[int, int, int]], ProgramTraffic] = field(default_factory=dict)
    grids: list[tuple[str, tuple[int, int, int]]] = field(default_factory=list)
    complete: bool = True
    atomics: int = 0  # atomic operations made: programs that may depend on one another's results

    @property
    def independent(self) -> bool:
        """One kernel launch and no atomics: each program's outputs are its own work, so those
        of a sample of programs can be checked alone."""
        return len(self.grids) == 1 and not self.atomics

    def busiest(self) -> tuple[tuple[str, tuple[int, int, int]], ProgramTraffic] | None:
        """The metered program that moved the most bytes."""
        if not self.programs:
            return None
        return max(self.programs.items(), key=lambda kv: (kv[1].bytes, kv[1].dot_flops))


# The interpreter builder's float element-wise operations: each counts its result's elements.
VECTOR_OPS = ("create_fadd", "create_fsub", "create_fmul", "create_fdiv", "create_frem", "create_fma",
              "create_fneg", "create_fabs", "create_exp", "create_exp2", "create_log", "create_log2",
              "create_sqrt", "create_rsqrt", "create_precise_sqrt", "create_precise_divf",
              "create_approx_divf", "create_sin", "create_cos", "create_erf", "create_floor",
              "create_ceil", "create_maximumf", "create_minimumf", "create_maxnumf", "create_minnumf",
              "create_clampf", "create_extern_elementwise")


class _OutOfTime(BaseException):
    """Raised from a hook when the budget is spent: a BaseException, so that the interpreter's
    `except Exception` (which wraps a kernel's errors) lets it through to `meter`."""


def sample(grid: tuple[int, int, int], n: "int | None | frozenset[int]" = 4) -> set[tuple[int, int, int]]:
    """Up to `n` grid indices (None: all): the first program, the last and others drawn at
    random (a kernel cannot know which of its programs will be metered). A set: the programs
    of those linear indices (x fastest) that the grid has."""
    import random
    gx, gy, gz = grid
    total = gx * gy * gz
    if isinstance(n, frozenset):
        picks = set(n)
    elif n is None or n >= total:
        picks = set(range(total))
    else:
        picks = {0, total - 1} | set(random.SystemRandom().sample(range(1, max(total - 1, 1)), max(n - 2, 0)))
    return {(k % gx, (k // gx) % gy, k // (gx * gy)) for k in picks if 0 <= k < total}


def meter(launch: Callable[..., Any], args: list, programs: "int | None | frozenset[int]" = 4,
          budget_s: float = 5.0) -> Traffic:
    """`launch(*args)` with only a sample of each launch's programs run (`programs` of them,
    None: every one, a set: those linear indices); what they moved."""
    import time
    try:
        from triton.runtime import interpreter as tri
        builder = tri.interpreter_builder
        executor = tri.GridExecutor
    except (ImportError, AttributeError) as e:
        raise MeterUnavailable(f"Triton's interpreter has no GridExecutor/interpreter_builder ({e})") from None
    missing = [m for m in ("create_masked_load", "create_masked_store", "create_dot", "set_grid_idx")
               if not hasattr(builder, m)]
    if missing:
        raise MeterUnavailable(f"Triton's interpreter builder lacks {', '.join(missing)}")
    traffic = Traffic()
    state: dict[str, Any] = {"kernel": "", "depth": 0, "deadline": time.monotonic() + budget_s}

    def current() -> ProgramTraffic:
        idx = tuple(getattr(builder, "grid_idx", None) or (0, 0, 0))
        return traffic.programs.setdefault((state["kernel"], idx), ProgramTraffic())

    def itemsize(handle) -> int:
        try:
            return max(1, handle.get_element_ty().primitive_bitwidth // 8)
        except Exception:  # noqa: BLE001 - a handle of another shape: the data's own size
            return int(getattr(handle.data, "itemsize", 4))

    def lanes(mask) -> int:
        import numpy as np
        return int(np.count_nonzero(mask.data)) if mask is not None else -1

    def counted(name: str, kind: str, ptr_at: int | None, mask_at: int | None):
        original = getattr(builder, name)

        def wrapper(*a, **kw):
            if time.monotonic() > state["deadline"]:
                raise _OutOfTime()
            state["depth"] += 1
            try:
                out = original(*a, **kw)
            finally:
                state["depth"] -= 1
            if state["depth"]:  # create_load calls create_masked_load: counted once, outermost
                return out
            p = current()
            if name.startswith("create_atomic"):
                traffic.atomics += 1
            if kind in ("vector", "other"):
                data = getattr(out, "data", None)
                size = int(getattr(data, "size", 1) or 1)
                if kind == "vector" and getattr(getattr(data, "dtype", None), "kind", "") == "f":
                    p.vector_ops += size
                else:
                    p.other_ops += size
                p.op_calls += 1
                return out
            if kind == "dot":
                x, y = a[0].data, a[1].data
                p.dot_flops += 2.0 * x.size * y.shape[-1]  # (batch) m k times n
                p.move_calls += 1
                return out
            if ptr_at is not None:
                ptr = a[ptr_at]
                on = lanes(a[mask_at]) if mask_at is not None and len(a) > mask_at else -1
                n = ptr.data.size if on < 0 else on
                nbytes = n * itemsize(ptr)
            else:  # descriptors: the block moved
                data = (out if kind == "load" else a[1]).data
                n, nbytes = data.size, data.size * data.itemsize
            if n == 0:
                return out  # every lane masked off: no transfer, and no work to excuse operations
            p.move_calls += 1
            if kind == "load":
                p.loads, p.load_bytes = p.loads + 1, p.load_bytes + nbytes
            else:
                p.stores, p.store_bytes = p.stores + 1, p.store_bytes + nbytes
            return out
        return wrapper

    def reduction(original):
        def wrapper(self, *a, **kw):
            if time.monotonic() > state["deadline"]:
                raise _OutOfTime()
            current().op_calls += 1
            return original(self, *a, **kw)
        return wrapper

    hooks = [("create_load", "load", 0, None), ("create_masked_load", "load", 0, 1),
             ("create_store", "store", 0, None), ("create_masked_store", "store", 0, 2),
             ("create_descriptor_load", "load", None, None), ("create_descriptor_store", "store", None, None),
             ("create_atomic_rmw", "store", 1, 3), ("create_atomic_cas", "store", 0, None),
             ("create_dot", "dot", None, None)] + [(name, "vector", None, None) for name in VECTOR_OPS]
    counted_names = {h[0] for h in hooks}
    hooks += [(name, "other", None, None) for name in sorted(vars(type(builder)))
              if name.startswith("create_") and name not in counted_names]
    original_init = executor.__init__

    def init(self, fn, arg_names, grid, *a, **kw):
        original_init(self, fn, arg_names, grid, *a, **kw)
        self.fn = _sampled(self.fn, builder, programs, traffic, state)

    with contextlib.ExitStack() as undo:
        for name, kind, ptr_at, mask_at in hooks:
            if hasattr(builder, name):
                builder.__dict__[name] = counted(name, kind, ptr_at, mask_at)
                undo.callback(builder.__dict__.pop, name, None)
        executor.__init__ = init
        undo.callback(setattr, executor, "__init__", original_init)
        # Reductions and scans are numpy's, outside the builder: each counted as one operation
        # (a loop of tl.sum over a tile loaded once is work no element count sees).
        for cls in (getattr(tri, "ReduceOps", None), getattr(tri, "ScanOps", None)):
            if cls is not None and "apply_impl" in vars(cls):
                own = vars(cls)["apply_impl"]
                cls.apply_impl = reduction(own)
                undo.callback(setattr, cls, "apply_impl", own)
        try:
            launch(*args)
        except _OutOfTime:
            traffic.complete = False
    return traffic


def _sampled(fn, builder, programs: "int | None | frozenset[int]", traffic: Traffic, state: dict) -> Callable:
    """`fn` (a kernel's Python function) that runs only for a sample of the grid's programs.
    It keeps fn's globals (the interpreter patches triton.language as fn's module sees it) and
    signature (the interpreter binds the arguments by it)."""
    import inspect
    keep: set = set()
    pick = sample  # gate runs with fn's globals: what it needs comes through its closure

    def gate(**kw):
        if not keep:
            grid = tuple(builder.grid_dim)
            keep.update(pick(grid, programs))
            traffic.grids.append((fn.__name__, grid))
        if tuple(builder.grid_idx) in keep:
            state["kernel"] = fn.__name__
            fn(**kw)

    wrapped = types.FunctionType(gate.__code__, fn.__globals__, fn.__name__, None, gate.__closure__)
    wrapped.__signature__ = inspect.signature(fn)
    wrapped.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    wrapped.__wrapped__ = fn
    return wrapped


@dataclass
class Audit:
    """Every program of a launch metered, or as many as the budget allowed (`covered` of
    `total`, drawn at random: none of them can be the one a kernel hides its work in for sure);
    `traffic` holds them all, `args` the arguments they ran on; `independent`: its programs'
    outputs are each their own work (Traffic.independent), so what a part of them wrote can be
    checked alone."""
    traffic: Traffic
    covered: int
    total: int
    args: list
    independent: bool


def audit(launch: Callable[..., Any], make_args: Callable[[], list], budget_s: float = 30.0,
          first: int = 16) -> Audit:
    """`launch(*args)` metered program by program, in batches of doubling size drawn at random
    from the programs not yet metered, until all are or `budget_s` is spent (the batch under
    way then stops: its programs count as far as they ran). Each batch runs the launch again on
    the same arguments (`make_args()`: fresh copies, asked for at most twice). A launch whose programs may depend on one
    another (more than one kernel launched, or atomics) is metered whole in one run instead,
    on fresh arguments: batches would run a program without the ones it reads from."""
    import random
    import time
    deadline = time.monotonic() + budget_s
    args = make_args()
    got = meter(launch, args, frozenset({0}), budget_s)
    total = max((gx * gy * gz for _, (gx, gy, gz) in got.grids), default=1)
    if not got.independent:
        args = make_args()
        whole = meter(launch, args, None, max(0.1, deadline - time.monotonic()))
        return Audit(whole, total if whole.complete else 0, total, args, False)
    merged = got
    done: set[int] = {0} if got.complete else set()
    order = list(range(1, total))
    random.SystemRandom().shuffle(order)
    if total > 1:  # the last program (a tail) in the first batch
        order.remove(total - 1)
        order.insert(0, total - 1)
    size = first
    while got.complete and order:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        batch = frozenset(order[:size])
        order, size = order[size:], size * 2
        got = meter(launch, args, batch, left)
        merged.programs.update(got.programs)
        merged.atomics += got.atomics
        if got.complete:
            done |= batch
    merged.complete = got.complete
    return Audit(merged, len(done), total, args, merged.atomics == 0)
