"""The `sim` backend: an analytical model of Ascend AI cores, for machines without an NPU.

It consumes the same triton_ascend skeletons and spaces as the `npu` backend. Every figure it
reports is a model's output, never a measurement: DeviceInfo.simulated is True, the device is
named after the chip profile, and the toolchain says `model: analytical`.

**Compile** = check and analyse the rendered module, statically: the same AST contract and
launch-option checks as `npu`, then the module's `ASCEND_COST` description (a tuple of
(name, value) pairs the template computes from its config and the op's sizes; see COST_KEYS)
is validated against the chip: UB capacity (multibuffer doubles the loop's buffers) with the
real compiler's error text, `ub overflow, requires N bits while M bits available`; L1/L0
capacity for cube kernels (the wording of those errors is ours, not the compiler's). Tail axes
that are not 32 B (vector) or 512 B (cube/mixed) multiples are padded, as triton-ascend pads
them rather than failing: the padding counts towards the bytes every transfer moves.

**Time** = the analytical model of tuner/backends/ascend_model.py (`estimate`), per chip
profile (tuner/backends/chips): its docstring says what it models and what it assumes.

**Verification**: with `verify="interpret"` (the default up to `verify_max_elements` elements
moved, inputs and outputs) the rendered kernel, its Ascend options stripped, runs through Triton's interpreter on
CPU tensors and is checked against the reference like on any device, so a wrong template fails
here. Above that size (`verify="reference"`) the interpreter would take minutes per config, so
the timed calls write the float64 reference; the kernel runs only in part: the programs the
first checked launch meters (their outputs checked where they wrote) and the winner's audit
(every program within its budget, the outputs checked whole), and device_info's toolchain says
`verify: partial (...)`. Timed calls never re-run the interpreter (a repeated launch on unchanged
inputs is answered from the first), nor the reference (one per input set and op).

**Memory**: every interpreted launch may load, store and update atomically only inside the
tensors it was passed (interpreter_bounds.py): the interpreter's pointers are this process's
host addresses, where the judge's references live.

**The declared costs are checked against the op and the kernel**: when compiled, the whole
launch's declared bytes (and a matmul's cube flops) must cover the op's own (`short_of_the_op`);
the first checked launch meters a sample of the kernel's programs through the interpreter
(sim_meter) and refuses a declaration that understates what they moved or computed
(`understated`; both in sim_checks.py); the winner's `memcheck` meters every program (or as many as `audit_s` allow).

The reference (torch eager) has no NPU to run on. Every backend must time one, so the sim
reports the op's roofline bound on the chip instead: its bytes at HBM bandwidth or its flops at
the cube (matmul) or vector peak, whichever is longer, plus the launch overhead, i.e. an ideal
vendor kernel. The summary's "vs torch eager" row on a `sim` run therefore compares with that
bound (toolchain `reference` says so), and reads at most about 1x.

Options: `chip` (a built-in name, a profile YAML or a CANN platform_config ini; default 910B2),
`verify` ("auto", "interpret", "reference"), `verify_max_elements` (default 131072), `audit_s`
(default 30: the winner's metering budget), `real_compile` (default true).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from tuner.backends.ascend_model import (ADAPTER_KINDS, COST_KEYS, Cost, CostError, Estimate, check_capacity,
                                         estimate, roofline_s, ub_required_bytes)
from tuner.backends.ascend_source import MULTIBUFFER_DEFAULT, check_launch_options, launches, read_cost, strip_options
from tuner.backends.base import Backend, BackendUnavailable, Refused
from tuner.backends.sim_checks import poisoned_copies, short_of_the_op, understated, wrong_where_written
from tuner.backends.triton_source import load_module
from tuner.codecheck import Forbidden, require_clean
from tuner.core.values import Build, DeviceInfo, OpSpec, Status

DEFAULT_CHIP = "910B2"
VERIFY_MAX_ELEMENTS = 1 << 17

# Seconds the winner's audit may meter programs for (memcheck; option audit_s).
AUDIT_S = 30.0


# ---- the backend ---------------------------------------------------------------------------------

class SimKernel:
    """A 'loaded' simulated kernel: its modelled seconds and how to produce its outputs
    (`interpreted`: by running the candidate's launch through Triton's interpreter)."""

    def __init__(self, seconds: float, run: Callable[[list], None], interpreted: bool = False,
                 cost: Cost | None = None, launch: Callable[..., None] | None = None, op=None):
        self.seconds = seconds
        self.run = run
        self.interpreted = interpreted
        self.cost = cost  # the declaration the time is modelled from
        self.launch = launch  # the module's own launch, for the meter (sim_meter)
        self.op = op  # the live op (its reference and tolerance check what the meter's programs wrote)
        self.metered: str | None = None  # "" once metered and covered; else why not


class SimBackend(Backend):
    name = "sim"
    language = "triton_ascend"

    @classmethod
    def bench_env(cls, env: dict[str, str]) -> dict[str, str]:
        # The interpreter from the process's start: Triton builds triton.language's own @jit
        # helpers (tl.cdiv, ...) when it is first imported, interpreted or not, and a kernel
        # interpreted later that calls one fails "Cannot call @triton.jit'd outside of the
        # scope of a kernel" (Triton 3.9, where the worker had imported it before the first
        # load). Compile workers are not benchmark workers: they keep the real front end.
        return {**env, "TRITON_INTERPRET": "1"}

    def __init__(self, device: int = 0, **options: Any) -> None:
        super().__init__(device, **options)
        from tuner.backends.chips import ChipError, load_profile
        try:
            self.profile = load_profile(options.get("chip") or DEFAULT_CHIP)
        except ChipError as e:
            raise BackendUnavailable(f"sim: {e}") from None
        self.verify = options.get("verify", "auto")
        if self.verify not in ("auto", "interpret", "reference"):
            raise BackendUnavailable(f"sim: verify={self.verify!r}: one of auto, interpret, reference")
        self._time: float | None = None
        # (kernel, args, their versions) of the last runs: the timed calls rotate over a few
        # buffer sets (tuner/exec/measure.py), and each would otherwise interpret the kernel
        # again (half a second a call for a small-block config at 37x1000: a minute's timing)
        self._recent: list[tuple] = []
        self._ref_fn: Any = None
        self._refs: dict = {}  # ids of an input set -> (inputs, versions, op spec, outputs): see load
        self._mode: str | None = None
        self._spec = OpSpec.from_json(options["op"]) if options.get("op") else None


    # ---- facts ----------------------------------------------------------------------------

    def render_context(self, op) -> dict[str, Any]:
        p = self.profile
        return {"CORES": p.vector_cores, "AIV": p.vector_cores, "AIC": p.cube_cores,
                "UB_BYTES": p.ub_bytes}

    def limits(self) -> dict[str, float]:
        return self.profile.limits()

    def _verify_mode(self) -> str:
        if self.verify != "auto":
            return self.verify
        if self._spec is None:
            return "interpret"
        if self._mode is None:
            from tuner.core.ops import DTYPE_BYTES, load_op
            n = load_op(self._spec).bytes / DTYPE_BYTES[self._spec.dtype]  # elements moved, in and out
            limit = int(self.options.get("verify_max_elements", VERIFY_MAX_ELEMENTS))
            self._mode = "interpret" if n <= limit else "reference"
        return self._mode

    def device_info(self, peaks: bool = True) -> DeviceInfo:  # nothing measured either way
        p = self.profile
        mode = self._verify_mode()
        verify = ("Triton interpreter on CPU tensors (Ascend options stripped)" if mode == "interpret"
                  else "partial: the op is too large to interpret every call; what the first "
                       "checked launch's metered programs write is checked against the reference "
                       "(the winner's audit: every program within its budget, the outputs whole), "
                       "the timed calls get the reference copied into their outputs")
        tools = {"model": "analytical (tuner.backends.sim); every time is modelled, none measured",
                 "chip_profile": p.source or p.name, "soc": p.soc, "verify": verify,
                 "reference": "not torch: the op's roofline bound on this chip (bytes at HBM bandwidth or "
                              "flops at peak) plus launch overhead",
                 "aic": str(p.cube_cores), "aiv": str(p.vector_cores), "clock_mhz": f"{p.clock_mhz:g}"}
        if not p.triton_ascend:
            tools["note"] = f"{p.soc} is not a triton-ascend target; modelled as if it were"
        tools["compile"] = self._compile_stage()
        peaks = {"copy_gbps": p.hbm_gbps}
        for dt, rate in p.cube_flops_per_cycle:  # the cube's peak per input dtype
            peaks[f"{dt}_gflops"] = rate * p.cube_cores * p.clock_mhz / 1e3
        return DeviceInfo(backend="sim", name=p.soc, cores=p.vector_cores,
                          limits=tuple(sorted(self.limits().items())), peaks=tuple(sorted(peaks.items())),
                          toolchain=tuple(sorted(tools.items())), simulated=True)

    # ---- 'compile': static checks and analysis ---------------------------------------------

    def compile(self, source: str, op: OpSpec, workdir: str, timeout_s: float) -> Build:
        t0 = time.monotonic()
        if op != self._spec:  # the op this compile models (a compile worker serves every op of a sweep)
            self._spec, self._mode = op, None

        def fail(error: str) -> Build:
            return Build(Status.COMPILE_ERROR, error=error, compile_s=time.monotonic() - t0)

        try:
            require_clean("triton_ascend", source)
            why = check_launch_options(source)
            raw = read_cost(source)
        except SyntaxError as e:
            return fail(f"SyntaxError: {e.msg} (line {e.lineno})")
        except Forbidden as e:
            return fail(str(e))
        except ValueError as e:
            return fail(f"sim: error: {e}")
        if why:
            return fail(why)
        if raw is None:
            return fail("sim: error: the module has no ASCEND_COST description; the simulator models a "
                        "kernel from it (README, 'Ascend simulator': keys " + ", ".join(COST_KEYS) + ")")
        try:
            cost = Cost.of(raw)
        except CostError as e:
            return fail(f"sim: error: {e}")
        options = {}
        for la in launches(source):
            options.update(la.ascend_options)
        grids = {la.grid for la in launches(source) if la.grid is not None}
        if grids and all(math.prod(g) != cost.programs for g in grids):
            return fail(f"sim: error: ASCEND_COST says programs={cost.programs} but the launch grid is "
                        f"{sorted(grids)}")
        mb = bool(options.get("multibuffer", MULTIBUFFER_DEFAULT))
        why = check_capacity(cost, self.profile, mb) or short_of_the_op(cost, *self._op_floor())
        if why:
            return fail(why)
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "kernel.ascend.py").write_text(source)
        (wd / "kernel.py").write_text(strip_options(source))
        real = self._real_compile(wd / "kernel.ascend.py", op, timeout_s - (time.monotonic() - t0))
        if real is not None and real.get("status") != "ok":
            return fail(real["error"])
        if real is not None:
            # The adapter knows the kernel's kind: a template's ASCEND_COST that says otherwise
            # is modelled as the compiler will build it.
            kinds = {ADAPTER_KINDS.get(k.get("mix_mode", "")) for k in real["kernels"]} - {None}
            if len(kinds) == 1 and cost.kind not in kinds:
                cost = dataclasses.replace(cost, kind=kinds.pop())
        est = estimate(cost, self.profile, options, self._dtype(), self._op_bytes())
        artifact = wd / "sim.json"
        artifact.write_text(json.dumps({"chip": self.profile.name, "cost": raw, "options": options,
                                        "kernel": str(wd / "kernel.py"), "estimate": est.to_json(),
                                        "ub_required_bytes": ub_required_bytes(cost, self.profile, mb),
                                        "compiled_by": real or {"frontend": "none", "why": self._frontend_why()}},
                                       default=list, indent=1))
        return Build(Status.OK, artifact=str(artifact), compile_s=time.monotonic() - t0,
                     binary_hash=hashlib.sha256(source.encode()).hexdigest()[:16])

    def _real_compile(self, path: Path, op: OpSpec, timeout_s: float) -> dict | None:
        """The module through triton-ascend's real front end and adapter (ascend_frontend), as
        {"status": "ok", "kernels": [...], ...} or {"status": "error", "error": message}; None
        where no triton-ascend can be found (then only the static checks above ran) or with
        option real_compile=False."""
        from tuner.backends.ascend_frontend import AscendFrontend
        if not self.options.get("real_compile", True):
            return None
        fe = AscendFrontend.find()
        if fe is None:
            return None
        from tuner.backends.base import _arg_specs
        ins, outs = _arg_specs(op)
        args = [[list(shape), str(dt).replace("torch.", "")] for shape, dt in ins + outs]
        out = fe.compile(str(path), args, len(ins), self.profile.soc, str(path.parent / "ascend_cache"),
                         max(30.0, timeout_s))
        if out.get("status") == "ok":
            return {"status": "ok", "frontend": f"triton-ascend {fe.version}", "kernels": out.get("kernels", []),
                    "stopped_before_bishengir": out.get("stopped_before_bishengir", False)}
        if out.get("status") == "error":
            return {"status": "error", "error": f"triton-ascend {fe.version} ({out.get('stage', '?')}): "
                                                f"{out.get('message', '').strip()}"}
        # The stage itself failed (a timeout, a broken environment): the config's failure only
        # when it timed out; otherwise said as the tool's.
        if out.get("status") == "timeout":
            return {"status": "error", "error": out.get("message", "")}
        raise BackendUnavailable(f"sim: triton-ascend's front end could not run: {out.get('message', '')}")

    def _compile_stage(self) -> str:
        """What checks a candidate before it is modelled, for the run's summary."""
        from tuner.backends.ascend_frontend import AscendFrontend
        fe = AscendFrontend.find() if self.options.get("real_compile", True) else None
        if fe is None:
            return f"static checks only (no triton-ascend: {self._frontend_why()})"
        return f"triton-ascend {fe.version}'s own front end and adapter (real), up to bishengir, which needs CANN"

    def _frontend_why(self) -> str:
        from tuner.backends.ascend_frontend import AscendFrontend
        if not self.options.get("real_compile", True):
            return "real_compile=False"
        return AscendFrontend.why_not()

    def _dtype(self) -> str:
        return self._spec.dtype if self._spec else "fp32"

    def _op_floor(self) -> tuple[float | None, float | None]:
        """(the op's bytes, its flops where they are a matmul's): what a declaration must cover."""
        if self._spec is None:
            return None, None
        from tuner.core.ops import load_op
        op = load_op(self._spec)
        return op.bytes, op.flops if self._spec.name == "matmul" else None

    def _op_bytes(self) -> float | None:
        """The op's own bytes (inputs and outputs once): the kernel's distinct GM bytes unless
        its ASCEND_COST says otherwise."""
        if self._spec is None:
            return None
        from tuner.core.ops import load_op
        return load_op(self._spec).bytes

    # ---- 'run': interpreter (or reference) outputs, modelled time ----------------------------

    def load(self, artifact: str, op) -> Any:
        rec = json.loads(Path(artifact).read_text())
        cost = Cost.of(_tuplify(rec["cost"]))
        seconds = estimate(cost, self.profile, rec["options"], op.spec.dtype, op.bytes).seconds
        os.environ["TRITON_INTERPRET"] = "1"
        from tuner.backends.interpreter_bounds import bound_interpreter
        from tuner.backends.triton_device import interpreter_fixed
        interpreter_fixed()
        bound_interpreter()
        path = Path(rec["kernel"])
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        launch = load_module(path, f"tuner_sim_{digest}", "triton_ascend").launch
        if self._verify_mode() == "interpret":
            return SimKernel(seconds, lambda args: launch(*args), interpreted=True, cost=cost, launch=launch, op=op)

        memo = self._refs

        def reference(args: list) -> None:  # not verified: the outputs get the reference
            n_in = len(op.input_names)
            ins, outs = list(args[:n_in]), list(args[n_in:])
            # The timed calls rotate over a few input sets: one float64 reference per set (and
            # per op: the memo is the backend's, so every config of the op shares it), else
            # every timed call recomputed it on the host, seconds each at 4096x4096.
            key = tuple(id(a) for a in ins)
            hit = memo.get(key)
            if hit is None or not _same(hit[0], ins, hit[1]) or hit[2] != op.spec:
                xs = [a.double() if a.is_floating_point() else a for a in ins]
                refs = [r.to(o.dtype) for r, o in zip(op.reference(xs), outs)]
                # held: the inputs keep their addresses, so an id is never another tensor's
                hit = memo[key] = (ins, [a._version for a in ins], op.spec, refs)
                while len(memo) > 8:
                    memo.pop(next(iter(memo)))
            for out, ref in zip(outs, hit[3]):
                out.copy_(ref)
        return SimKernel(seconds, reference, cost=cost, launch=launch, op=op)

    def launch(self, kernel: Any, args: list) -> None:
        self._time = kernel.seconds
        if any(k is kernel and _same(held, args, versions) for k, held, versions in self._recent):
            return  # the same kernel on the very same, unchanged tensors: the outputs hold it already
        kernel.run(args)
        # Holding the tensors keeps their addresses from being reused by the next check's.
        self._recent = [*self._recent[-(_RECENT - 1):], (kernel, list(args), [a._version for a in args])]

    def launch_checked(self, kernel: Any, args: list) -> None:
        """`launch`, after the kernel's first checked launch has been metered: a sample of its
        programs run through the interpreter at these arguments' shapes (sim_meter), and what
        they moved and computed held against the module's ASCEND_COST (the time is a model of
        that declaration, so it must cover the kernel). Wherever the candidate's launch
        function runs, it runs under a dispatch mode: any torch op besides allocation, views
        and the interpreter's own moves of the arguments is the op's work done on the host,
        which the model would never see. Raises Refused (HostCompute) with the reason."""
        from tuner.backends.triton_device import INTERPRETER_OK, without_host_compute
        if getattr(kernel, "launch", None) is not None and kernel.metered is None:
            # Where the whole kernel is interpreted anyway (small shapes), every program is
            # metered; above that a sample: a program it misses can still do more than declared.
            every = getattr(kernel, "interpreted", False)
            kernel.metered = self._meter(kernel, args, INTERPRETER_OK, None if every else 4)
        if kernel.metered:
            raise Refused(kernel.metered)
        if not getattr(kernel, "interpreted", False):
            return self.launch(kernel, args)
        without_host_compute(lambda: self.launch(kernel, args), INTERPRETER_OK)

    @staticmethod
    def _meter(kernel: SimKernel, args: list, allowed: frozenset[str], programs: int | None) -> str:
        """Why the kernel's declared costs do not cover it when metered, or ""; where the
        kernel is not otherwise run (above the interpreted size), also why what the metered
        programs wrote is not the op's result there."""
        from tuner.backends.sim_meter import MeterUnavailable, meter
        from tuner.backends.triton_device import without_host_compute
        # The metered run writes only a sample: never into the real outputs. Its outputs are
        # checked too, whole where every program ran: a kernel that did less when metered than
        # when checked would otherwise have its lighter run held to the declaration.
        copies, poisons = poisoned_copies(kernel.op, args)
        got: list = []
        try:
            without_host_compute(lambda: got.append(meter(kernel.launch, copies, programs)), allowed)
        except MeterUnavailable as e:
            raise BackendUnavailable(f"sim: the declared costs cannot be checked: {e}") from None
        why = understated(kernel.cost, got[0])
        if why:
            return why
        whole = programs is None and got[0].complete
        if not (whole or got[0].independent):
            return ""  # a sample of programs that read one another's results: not checkable alone
        n_in = len(kernel.op.input_names)
        return wrong_where_written(kernel.op, args[:n_in], copies[n_in:], poisons, whole) or ""

    def memcheck(self, artifact: str, op: OpSpec, timeout_s: float) -> str:
        """The winner's declaration held to every one of its programs (sim_meter.audit): its
        checked launches metered a sample only above the interpreted size, and a kernel can
        put the work in a program the sample missed (one program doing the others' rows, all
        of them modelled as one program's share). On fresh inputs, on copies, under the
        dispatch mode, within `audit_s` (option, default 30 s; the programs are drawn at random
        where not all fit): "clean" with the coverage, "errors: <why>" or "not run: <why>"."""
        from tuner.backends.sim_meter import MeterUnavailable, audit
        from tuner.backends.triton_device import INTERPRETER_OK, without_host_compute
        import random

        import torch

        from tuner.core.ops import arg_specs, load_op
        if op != self._spec:
            self._spec, self._mode = op, None
        live = load_op(op)
        kernel = self.load(artifact, live)
        if kernel.launch is None:
            return "not run: the kernel has no launch to meter"
        _, outs = arg_specs(live)
        xs = live.make_inputs(random.SystemRandom().randrange(1, 2**31))
        base = list(xs) + [torch.zeros(shape, dtype=dt) for shape, dt in outs]
        # The audit asks for a fresh set at most twice, inside the dispatch mode: made here.
        sets = [poisoned_copies(live, base) for _ in range(2)]
        poisons: list = []

        def make_args() -> list:
            copies, drawn = sets.pop()
            poisons[:] = drawn
            return copies
        budget = min(float(self.options.get("audit_s", AUDIT_S)), max(1.0, timeout_s - 10))
        got: list = []
        try:
            without_host_compute(lambda: got.append(audit(kernel.launch, make_args, budget)), INTERPRETER_OK)
        except MeterUnavailable as e:
            return f"not run: the declared costs cannot be checked: {e}"
        except Refused as e:
            return f"errors: {e}"
        except Exception as e:  # noqa: BLE001 - the kernel's own failure under the interpreter
            return f"errors: the kernel failed when metered: {type(e).__name__}: {e}"[:2000]
        a = got[0]
        whole = a.covered >= a.total and a.traffic.complete
        why = understated(kernel.cost, a.traffic)
        if not why and (whole or a.independent):
            why = wrong_where_written(live, xs, a.args[len(xs):], poisons, whole)
        if why:
            return f"errors: {why}"
        if whole:
            return (f"clean (every one of its {a.total} programs metered against ASCEND_COST, "
                    f"its outputs checked whole)")
        checked = ("what they wrote checked" if a.independent else
                   "outputs not checked: its programs depend on one another (several kernels or atomics)")
        return (f"clean ({a.covered} of its {a.total} programs, drawn at random, metered against "
                f"ASCEND_COST within {budget:.0f} s, {checked})")

    def time_call(self, fn: Callable[[], None], before: Callable[[], None] | None = None) -> float:
        """The modelled seconds of the kernel `fn` launches; for anything else (the torch
        reference) the op's roofline bound on the chip (see the module docstring). `before`
        (the harness's poison of the outputs) is not run: the time is the model's, from the
        module's declared costs, so a kernel gains nothing by skipping work here, and outputs
        left as the last call wrote them let a repeated launch be answered from it instead of
        running the interpreter again for every timed call."""
        self._time = None
        if fn is self._ref_fn:  # the reference again: no need to run it on the host
            return self._reference_s()
        fn()
        if self._time is not None:
            return self._time
        self._ref_fn = fn
        return self._reference_s()

    def _reference_s(self) -> float:
        if self._spec is None:
            return self.profile.launch_us * 1e-6
        from tuner.core.ops import load_op
        op = load_op(self._spec)
        return roofline_s(self.profile, op.flops, op.bytes, self._spec.name == "matmul")


_RECENT = 4  # runs remembered: more than the buffer sets timed calls rotate over


def _same(held: list | None, args: list, versions: list | None) -> bool:
    return (held is not None and len(held) == len(args) and all(a is b for a, b in zip(held, args))
            and [a._version for a in args] == versions)


def _tuplify(x: Any) -> Any:
    """JSON lists back to the tuples ASCEND_COST uses."""
    if isinstance(x, list):
        return tuple(_tuplify(v) for v in x)
    if isinstance(x, dict):
        return {k: _tuplify(v) for k, v in x.items()}
    return x


def model_config(backend: SimBackend, skeleton, config, context: dict[str, Any]) -> Estimate | str:
    """One config through the simulator without workers or verification: rendered, checked
    ('compiled') and modelled. Returns the estimate, or why it is invalid or fails to compile."""
    why = skeleton.space.check(config, context, backend.limits())
    if why is not None:
        return f"INVALID: {why}"
    source = skeleton.render(config, context)
    try:
        require_clean("triton_ascend", source)
        err = check_launch_options(source)
        raw = read_cost(source)
    except (SyntaxError, Forbidden, ValueError) as e:
        return f"COMPILE_ERROR: {e}"
    if err or raw is None:
        return f"COMPILE_ERROR: {err or 'no ASCEND_COST'}"
    cost = Cost.of(raw)
    options: dict[str, Any] = {}
    for la in launches(source):
        options.update(la.ascend_options)
    err = check_capacity(cost, backend.profile, bool(options.get("multibuffer", MULTIBUFFER_DEFAULT)))
    if err:
        return f"COMPILE_ERROR: {err}"
    return estimate(cost, backend.profile, options, backend._dtype(), backend._op_bytes())


def model_space(op_name: str, shape: str, dtype: str = "fp32", chip: str = DEFAULT_CHIP,
                skeleton=None, configs=None) -> list[tuple[Any, Estimate | str]]:
    """Configs (default: every one) of an op's triton_ascend skeleton (or `skeleton`) on `chip`,
    modelled statically: what the sim backend would report, without workers or verification.
    For tests and benchmarks of the model itself."""
    from tuner.core.ops import builtin_spec, load_op, render_context
    from tuner.core.skeleton import library_skeleton
    spec = builtin_spec(op_name, shape, dtype)
    backend = SimBackend(0, chip=chip, op=spec.to_json(), verify="reference")
    skeleton = skeleton or library_skeleton(op_name, "triton_ascend")
    op = load_op(spec)
    context = {**render_context(op), **backend.render_context(op)}
    return [(c, model_config(backend, skeleton, c, context))
            for c in (configs if configs is not None else skeleton.space.configs())]
