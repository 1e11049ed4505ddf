"""`tuner verify model.py --db DB`: the model with the table's kernels swapped in, against the
model as it is: the same outputs, and how much faster, measured side by side in one process.

Outputs: on fresh inputs (drawn by the file's get_inputs() again), the patched model's and the
unpatched model's outputs are each compared with the model run in float64 on the same inputs
(its parameters cast); the patched model passes when its error is at most 8x the unpatched
model's own plus the dtype's absolute tolerance, the rule the harness applies to each kernel
(atol raised to 8x torch's own error), so a patch is held to what torch itself achieves in
this dtype, through the whole model. A kernel patched in wrongly fails here.

Latency: eager, patched eager and (unless `compile=False`) torch.compile with
max-autotune-no-cudagraphs and the patched model under the same torch.compile (its outputs
held to the same bound), timed in one interleave (a call of each in turn, `rounds` times,
device-synchronised), medians reported with the speedups. Nothing is claimed that this run
did not measure. The timed calls go through `timing_sets`: no call repeats the inputs of the
calls before it, so a served kernel that keeps results keyed by its inputs finds none to reuse.

Advice: a patched variant slower than its plain one is said; which routes to keep is then
measured, not inferred from the kernels timed alone (their routes' host time is not in
those): in eager mode the model patched with each routed op alone, and the ones that paid
together, against eager (`routes_in_eager`); under torch.compile each op alone routed
against torch.compile (`routes_under_compile`). With the device's copy rate, each routed call's
floor is known, and verify says when no kernel for these calls could bring patched eager to
torch.compile (`tuner.model.advice.routing_ceiling`). The wording is tuner.model.advice's.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.model.advice import (SAME_WITHIN, compile_advice, eager_advice, routes_advice, routing_ceiling,
                                 slower)

SLACK = 8.0  # the harness's factor over torch's own error (measure.SLACK_FACTOR)


@dataclass(frozen=True)
class Verdict:
    model: str
    device: str
    dtype: str
    passed: bool
    error: float  # the patched model's largest error against float64
    eager_error: float  # the unpatched model's
    allowed: float
    medians_s: tuple[tuple[str, float], ...] = ()
    routed: tuple[tuple[str, int, int], ...] = ()  # (op call, routed, fell back)
    notes: tuple[str, ...] = field(default=())
    modules: tuple[tuple[str, str], ...] = ()  # (module name, op) replaced by the patch
    # Per routed call signature: (stats key, calls per forward, torch's time per call, the
    # tuned kernel's, time saved per forward), each call timed alone in the same run.
    ops: tuple[tuple[str, int, float, float, float], ...] = ()
    # When patched + torch.compile was slower than torch.compile and several ops were routed:
    # per op, the median with only that op routed under torch.compile (the rest left to the
    # compiler), timed in an interleave with torch.compile (its median in the same run).
    under_compile: tuple[tuple[str, float, float], ...] = ()
    functions: tuple[tuple[str, str], ...] = ()  # (the model's function, op) taken over by the patch
    # When patched eager was slower than eager and several ops were routed: per op, the
    # median with only that op routed, then ("+".join(the ops kept), median) with every op
    # that paid alone routed together (where that is a subset), each timed in an interleave
    # with eager (eager's median in the same run): the routes that pay end to end, their
    # checks, copies and launches counted, which the per-op table (kernels alone) leaves out.
    in_eager: tuple[tuple[str, float, float], ...] = ()
    # Per routed call signature: the least time any kernel could take for it, its bytes (inputs
    # and outputs) at the device's copy bandwidth (`peaks`); empty when no copy rate was given.
    floors: tuple[tuple[str, float], ...] = ()


# The mode every variant is compiled in, each with dynamic=False: for the shapes it is timed
# on, as a user's first compile is (one process compiles the same code objects several times
# here, and Dynamo would otherwise recompile the later ones with symbolic sizes).
COMPILE_MODE = "max-autotune-no-cudagraphs"



TIMING_SET_BYTES = 2 << 30  # the most the extra input sets of the timed calls may take together


def timing_sets(xs: list, n: int) -> list[list]:
    """Up to `n` input lists for the timed forwards: the file's, then the same with every
    floating-point tensor's elements rotated by a different amount (the same values elsewhere,
    dtype, shape and device kept); other inputs (token ids, masks, sizes) as they are, whose
    values a model may depend on for its meaning. Fewer where the copies would take more than
    `TIMING_SET_BYTES`. A kernel served inside the model that kept its results keyed by its
    inputs (honest while tuned, caching later) would otherwise answer every timed forward from
    the first. Not covered: a model whose only inputs are token ids (its hidden states repeat
    with them)."""
    import torch
    floats = [x for x in xs if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1]
    per_set = sum(x.numel() * x.element_size() for x in floats)
    n = max(1, min(n, 1 + TIMING_SET_BYTES // per_set)) if per_set else 1
    out = [list(xs)]
    for k in range(1, n):
        out.append([x.flatten().roll(k * 7919 % x.numel() or 1).view_as(x)
                    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1 else x for x in xs])
    return out


def cycling(fn, sets: list[list]):
    """`fn` called on the next of `sets` at each call, in turn."""
    state = {"k": -1}

    def call():
        state["k"] = (state["k"] + 1) % len(sets)
        return fn(*sets[state["k"]])
    return call


def interleaved(fns: dict, sync, rounds: int, reps: int = 1) -> dict[str, float]:
    """The median seconds per call of each function, by the wall clock: one warm-up call each,
    then `rounds` rounds that call each in turn, `reps` calls back to back between two
    synchronisations (as a forward issues them), so that drift hits all alike; each round
    starts one place later (`measure.round_order`)."""
    from tuner.exec.measure import round_order
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    sync()
    names = list(fns)
    for r in range(rounds):
        for name in (names[i] for i in round_order(len(names), r)):
            fn = fns[name]
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t0) / reps)
    return {k: statistics.median(v) for k, v in samples.items()}


def op_contributions(patch, sync, rounds: int, per_forward: dict[str, int],
                     floors: dict[str, float] | None = None, copy_gbps: float = 0.0) -> list[tuple[str, int, float, float, float]]:
    """What each routed call saves: the tuned kernel and the op's definition in torch, on random
    inputs of the call's shapes, dtypes and device, timed in turns (each as back-to-back calls
    between two synchronisations, as a forward issues them), times the calls per forward. What
    the end-to-end difference holds beyond their sum is the rest: host time around the calls,
    fusion the patch takes away. With `copy_gbps`, `floors` gets each call's bytes (inputs and
    torch's outputs) over that rate: no kernel for the call can take less."""
    import torch

    out = []
    for key, op, ins, kernel, _ in patch.served():
        g = torch.Generator(device=ins[0][2]).manual_seed(0)
        xs = [torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dt) for shape, dt, dev in ins]
        if op in ("rmsnorm", "layernorm"):
            xs[1:] = [1 + 0.1 * x for x in xs[1:]]
        ref = patch.torch_of(op)
        if copy_gbps > 0 and floors is not None:
            moved = sum(x.numel() * x.element_size() for x in xs) + sum(
                o.numel() * o.element_size() for o in _outputs(ref(*xs)))
            floors[key] = moved / (copy_gbps * 1e9)
        t = interleaved({"torch": lambda: ref(*xs), "tuned": lambda: kernel._launch(xs)}, sync, rounds, reps=10)
        t_torch, t_tuned = t["torch"], t["tuned"]
        n = per_forward.get(key, 0)
        out.append((key, n, t_torch, t_tuned, n * (t_torch - t_tuned)))
    return sorted(out, key=lambda r: -r[4])


def _outputs(out) -> list:
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for x in out for o in _outputs(x)]
    if hasattr(out, "to_tuple"):  # a transformers ModelOutput
        return _outputs(out.to_tuple())
    return []


def _max_err(outs: list, refs: list) -> float:
    err = 0.0
    for o, r in zip(outs, refs):
        if o.is_floating_point():
            err = max(err, float((o.double() - r.double()).abs().nan_to_num(float("inf")).max()) if o.numel() else 0.0)
    return err


def verify(path: str | Path, table, device: str = "cpu", dtype: str | None = None, rounds: int = 20,
           compile: bool = True, ops=None, peaks: dict[str, float] | None = None) -> Verdict:
    """`ops`: the only ops the patch routes (`runtime.patch(..., ops=)`; None: every op the
    table holds), in every patched variant verify times. `peaks`: the device's measured
    ceilings (`DeviceInfo.peaks`); with a copy rate, each routed call's floor is known and
    `routing_ceiling` says when no kernel for these calls could bring patched eager to
    torch.compile."""
    import torch

    from tuner.core.op import TOLERANCE
    from tuner.model.profile import _prepared, load_model
    from tuner.serve.patch import patched_copy, unpatch
    model, inputs = load_model(path)
    dt = dtype or "fp32"
    base = copy.deepcopy(model)
    model, xs = _prepared(model, inputs, device, dtype)
    ref_model, ref_xs = _prepared(base, [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                                         for x in inputs], device, "fp64")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    notes: list[str] = []
    with torch.no_grad():
        ref = _outputs(ref_model(*ref_xs))
        eager = _outputs(model(*xs))
        # The patched model: a copy sharing every parameter and buffer, the patch on it alone,
        # so that the timing below can call both in turn.
        patched_model = patched_copy(model, table, ops=ops)
        patched = _outputs(patched_model(*xs))
        stats = {k: list(v) for k, v in patched_model.tuner_patch.stats.items()}
        per_forward = {k: v[0] for k, v in stats.items()}  # one forward so far
        modules = dict(patched_model.tuner_patch.modules)
        functions = dict(patched_model.tuner_patch.model_functions)
        eager_err, err = _max_err(eager, ref), _max_err(patched, ref)
        allowed = SLACK * eager_err + TOLERANCE[dt][0]
        passed = len(patched) == len(ref) and err <= allowed
        sets = timing_sets(xs, rounds + 1)  # the warm-up call and each round's: each its own inputs
        fns = {"eager": cycling(model, sets)}
        if compile:
            try:
                compiled = torch.compile(model, mode=COMPILE_MODE, dynamic=False)
                compiled(*xs)  # compiled here, not in the timed calls
                fns["torch.compile"] = cycling(compiled, sets)
            except Exception as e:  # noqa: BLE001 - said, and the rest measured
                notes.append(f"torch.compile not measured: {type(e).__name__}: {str(e)[:200]}")
        fns["patched eager"] = cycling(patched_model, sets)
        if compile and "torch.compile" in fns:
            try:
                patched_compiled = torch.compile(patched_model, mode=COMPILE_MODE, dynamic=False)
                out = _outputs(patched_compiled(*xs))
                compiled_err = _max_err(out, ref)
                if compiled_err > allowed:
                    passed = False
                    notes.append(f"patched + torch.compile: error {compiled_err:.3g} > allowed {allowed:.3g}")
                fns["patched + torch.compile"] = cycling(patched_compiled, sets)
            except Exception as e:  # noqa: BLE001 - said, and the rest measured
                notes.append(f"patched + torch.compile not measured: {type(e).__name__}: {str(e)[:200]}")
        for op, why in getattr(patched_model.tuner_patch, "refused", {}).items():
            notes.append(f"{op}: its modules were left as they are: {why}")
        medians = interleaved(fns, sync, rounds)
        floors: dict[str, float] = {}
        per_op = op_contributions(patched_model.tuner_patch, sync, rounds, per_forward, floors,
                                  float((peaks or {}).get("copy_gbps") or 0.0))
        unpatch(patched_model)
        from tuner.serve.calls import SIZES
        # the ops routed under torch.compile too (a module extracted whole is the compiler's there)
        routed_ops = sorted({k.split(" ")[0] for k, v in stats.items() if v[0]} & set(SIZES))
        if any(v[0] for v in stats.values()):  # with no call routed, a difference is the machine's noise
            notes += slower(medians, compiled=bool(routed_ops))
        beaten = [e for e in getattr(table, "entries", ()) if getattr(table, "slower", lambda e: "")(e)]
        if beaten:
            notes.append("not served, torch's own implementation ran faster in their runs (--serve-slower, "
                         "`runtime.load(..., serve_slower=True)`, serves them): " + ", ".join(
                             f"{e['op']} {'x'.join(str(v) for v in e['sizes'].values())} {e['dtype']} "
                             f"({e['speedup_vs_reference']:.2f}x)" for e in beaten[:6])
                         + (f" and {len(beaten) - 6} more" if len(beaten) > 6 else ""))
        eager_ops = sorted({k.split(" ")[0] for k, v in stats.items() if v[0]})
        in_eager: list[tuple[str, float, float]] = []
        if eager_ops and medians["patched eager"] > medians["eager"] * (1 + SAME_WITHIN):
            # The per-op table times each kernel alone; end to end its route costs more (the
            # checks, views and copies around the launch), so which routes pay is measured.
            in_eager = (routes_in_eager(model, table, xs, sync, rounds, eager_ops, fns["eager"], ref, allowed, notes)
                        if len(eager_ops) > 1 else [(eager_ops[0], medians["patched eager"], medians["eager"])])
            notes.append(routes_advice(eager_ops, in_eager))
        else:
            advice = eager_advice(per_op)
            if advice:
                notes.append(advice)
        singles: list[tuple[str, float, float]] = []
        if routed_ops and "torch.compile" in medians and medians.get("patched + torch.compile", 0.0) > \
                medians["torch.compile"] * (1 + SAME_WITHIN):
            if len(routed_ops) > 1:
                singles = routes_under_compile(model, table, xs, sync, rounds, routed_ops, fns["torch.compile"],
                                               ref, allowed, notes, ops)
            notes.append(compile_advice(routed_ops, singles))
        ceiling = routing_ceiling(per_op, floors, medians)
        if ceiling:
            notes.append(ceiling)
    routed = tuple(sorted((k, v[0], v[1]) for k, v in stats.items()))
    return Verdict(str(path), device, dt, passed, err, eager_err, allowed,
                   tuple(medians.items()), routed, tuple(notes),
                   tuple(sorted(modules.items())), tuple(per_op), tuple(singles), tuple(sorted(functions.items())),
                   tuple(in_eager), tuple(sorted(floors.items())))


def routes_in_eager(model, table, xs, sync, rounds: int, ops: list[str], eager, ref, allowed: float,
                    notes: list[str]) -> list[tuple[str, float, float]]:
    """(op, median with only `op` routed in eager mode, eager's median in the same interleave)
    per op; then, where some but not all paid alone (faster than eager by more than
    SAME_WITHIN), ("a+b", median, eager's) with those routed together: the routes that pay end
    to end. A variant whose outputs miss the bound is said and left out."""
    from tuner.serve.patch import patched_copy, unpatch

    def timed(names: set[str]) -> tuple[float, float] | None:
        m = patched_copy(model, table, ops=names)
        try:
            e = _max_err(_outputs(m(*xs)), ref)
            if e > allowed:
                notes.append(f"patched eager routing only {', '.join(sorted(names))}: error {e:.3g} > allowed {allowed:.3g}")
                return None
            t = interleaved({"eager": eager, "only": cycling(m, timing_sets(xs, rounds + 1))}, sync, rounds)
            return t["only"], t["eager"]
        finally:
            unpatch(m)

    out = []
    for op in ops:
        t = timed({op})
        if t is not None:
            out.append((op, *t))
    keep = sorted(op for op, t, t_eager in out if t < t_eager * (1 - SAME_WITHIN))
    if 1 < len(keep) < len(ops):
        t = timed(set(keep))
        if t is not None:
            out.append(("+".join(keep), *t))
    return out


def routes_under_compile(model, table, xs, sync, rounds: int, ops: list[str], compiled, ref, allowed: float,
                         notes: list[str], routed=None) -> list[tuple[str, float, float]]:
    """(op, median with only `op` routed under torch.compile, torch.compile's median in the
    same interleave) per op: which routes pay for the fusion they take from the compiler."""
    import torch

    from tuner.serve.patch import patched_copy, unpatch
    out = []
    for op in ops:
        m = patched_copy(model, table, under_compile={op}, ops=routed)
        try:
            c = torch.compile(m, mode=COMPILE_MODE, dynamic=False)
            e = _max_err(_outputs(c(*xs)), ref)
            if e > allowed:
                notes.append(f"patched + torch.compile routing only {op}: error {e:.3g} > allowed {allowed:.3g}")
                continue
            t = interleaved({"torch.compile": compiled, "only": cycling(c, timing_sets(xs, rounds + 1))}, sync, rounds)
            out.append((op, t["only"], t["torch.compile"]))
        except Exception as e:  # noqa: BLE001 - said, and the rest measured
            notes.append(f"patched + torch.compile routing only {op} not measured: {type(e).__name__}: {str(e)[:200]}")
        finally:
            unpatch(m)
    return out


@dataclass(frozen=True)
class Ran:
    """`tuner run`: the patched model's forward on the file's inputs, what served it, its time."""
    model: str
    device: str
    dtype: str
    forward_s: float  # median of `iterations` device-synchronised forwards
    iterations: int
    routed: tuple[tuple[str, int, int], ...] = ()  # (op call, routed, fell back), per forward
    modules: tuple[tuple[str, str], ...] = ()  # (module name, op) replaced
    outputs: tuple[tuple[tuple[int, ...], str], ...] = ()  # (shape, dtype) of each output tensor
    saved: str | None = None


def run_patched(path: str | Path, table, device: str = "cpu", dtype: str | None = None, iterations: int = 10,
                save: str | Path | None = None, ops=None) -> Ran:
    """The model of `path` with `table`'s kernels in place (runtime.patch), run `iterations`
    times on its get_inputs(); with `save`, its last outputs written there (torch.save, on the
    host). Routing counts are of one forward. `ops`: the only ops routed (None: all the table
    holds). Checks nothing: `verify` compares."""
    import torch

    from tuner.model.profile import _prepared, load_model
    from tuner.serve.patch import patch, unpatch
    if iterations < 1:
        raise ValueError(f"iterations={iterations}: at least 1")
    model, inputs = load_model(path)
    model, xs = _prepared(model, inputs, device, dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        patch(model, table, ops=ops)
        try:
            out = model(*xs)  # the first call resolves and loads the kernels: not timed
            sync()
            stats = {k: list(v) for k, v in model.tuner_patch.stats.items()}
            modules = dict(model.tuner_patch.modules)
            times = []
            for _ in range(iterations):
                t0 = time.perf_counter()
                out = model(*xs)
                sync()
                times.append(time.perf_counter() - t0)
        finally:
            unpatch(model)
    outs = _outputs(out)
    saved = None
    if save is not None:
        torch.save([o.detach().cpu() for o in outs], save)
        saved = str(save)
    return Ran(str(path), device, dtype or "as built", statistics.median(times), iterations,
               tuple(sorted((k, v[0], v[1]) for k, v in stats.items())), tuple(sorted(modules.items())),
               tuple((tuple(o.shape), str(o.dtype).removeprefix("torch.")) for o in outs), saved)
