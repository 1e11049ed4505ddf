"""What `tuner verify` says from what it measured: which patched variant ran slower than its
plain one (`slower`), which routes to keep in eager mode (`routes_advice` from the end-to-end
ablation, `eager_advice` from the per-op table) and under torch.compile (`compile_advice`), and
how far routing can go at all (`most_saved`, `routing_ceiling`). Pure functions of the figures
(tuner.model.verify measures them): every sentence quotes a figure measured in the same run."""

from __future__ import annotations


SAME_WITHIN = 0.02  # a patched variant this much slower than its plain one is said to be slower


def slower(medians: dict[str, float], compiled: bool = True) -> list[str]:
    """What a user should not run: each patched variant measured slower than the same model
    unpatched in the same mode (eager, torch.compile), with the ratio (the routes to keep in
    that mode are measured and advised after it: `routes_advice`, `compile_advice`). `compiled`: whether any
    call is routed under torch.compile (modules extracted whole are not: the compiler traces
    their own forward, and a difference there is the machine's)."""
    out = []
    for patched, plain, mode in (("patched eager", "eager", "in eager mode"),
                                 ("patched + torch.compile", "torch.compile", "under torch.compile")):
        if patched == "patched + torch.compile" and not compiled:
            continue
        if patched in medians and plain in medians and medians[patched] > medians[plain] * (1 + SAME_WITHIN):
            out.append(f"{patched} is slower than {plain} ({medians[plain] / medians[patched]:.2f}x): the routed "
                       f"calls cost more than they save here {mode} (which to keep: below)")
    return out


def most_saved(ops: list[tuple[str, int, float, float, float]], floors: dict[str, float]) -> float | None:
    """The most that routing these calls could save per forward: each call's time in torch
    (timed alone) less its floor (its bytes at copy bandwidth), times its calls per forward, as
    if its route cost nothing; None without a floor for every call. An upper bound: a kernel
    at the floor with a free route removes at most torch's time for the call and adds the floor."""
    if not ops or any(key not in floors for key, *_ in ops):
        return None
    return sum(n * max(0.0, t_torch - floors[key]) for key, n, t_torch, _, _ in ops)


def routing_ceiling(ops: list[tuple[str, int, float, float, float]], floors: dict[str, float],
                    medians: dict[str, float]) -> str | None:
    """Said when patched eager cannot reach torch.compile by tuning the routed ops further:
    what torch.compile saved over eager in this run is more than `most_saved`. Then the gap is
    in what the compiler does to the rest of the model (its fusion, its host time), which no
    kernel for these calls touches."""
    most = most_saved(ops, floors)
    if most is None or "torch.compile" not in medians or "eager" not in medians:
        return None
    gained = medians["eager"] - medians["torch.compile"]
    if gained <= most:
        return None
    return (f"patched eager cannot reach torch.compile here by tuning these ops: torch.compile saved "
            f"{gained * 1e6:.1f} us per forward over eager; routing every call above could save at most "
            f"{most * 1e6:.1f} us (each call's bytes at copy bandwidth, its route free); the rest of compile's "
            f"gain is in the model's other operations")


def routes_advice(ops: list[str], measured: list[tuple[str, float, float]]) -> str:
    """What to pass `runtime.patch(..., ops=)` after patched eager measured slower than eager:
    the ops that were faster routed alone than eager (by more than SAME_WITHIN), or the one
    fastest alone where those routed together were not, or none; with every figure measured."""
    singles = [(op, t, t_eager) for op, t, t_eager in measured if "+" not in op]
    keep = sorted(op for op, t, t_eager in singles if t < t_eager * (1 - SAME_WITHIN))
    said = "".join(f"; only {op} routed: {t_eager / t:.2f}x eager" for op, t, t_eager in singles)
    together = next(((t, t_eager) for op, t, t_eager in measured if op == "+".join(keep) and "+" in op), None)
    if together:
        said += f"; {', '.join(keep)} routed together: {together[1] / together[0]:.2f}x eager"
        if together[0] >= together[1] * (1 - SAME_WITHIN):  # together they did not pay: the best one alone
            keep = [min((r for r in singles if r[0] in keep), key=lambda r: r[1] / r[2])[0]]
    if keep:
        return (f"in eager mode, route only {', '.join(keep)}: runtime.patch(model, table, ops={_names(keep)}) "
                f"(tuner run/verify --ops {','.join(keep)}){said}")
    return (f"in eager mode no route paid alone ({', '.join(ops)}): run the model unpatched in eager mode{said}")


def _names(ops: list[str]) -> str:
    """A set of op names as Python source, in a fixed order (a set's repr follows the hash seed)."""
    return "{" + ", ".join(repr(o) for o in sorted(ops)) + "}"


def eager_advice(ops: list[tuple[str, int, float, float, float]]) -> str | None:
    """Which ops to route in eager mode when some cost more than torch's own: from the per-op
    table (each routed call's tuned kernel and torch's definition timed alone), the ops whose
    calls in a forward take longer tuned than torch's by more than SAME_WITHIN; None when none
    does. The tuned side is the kernel's launch as served (`Kernel._launch`), the route's own
    checks not counted."""
    by_op: dict[str, list[float]] = {}
    for key, n, t_torch, t_tuned, _ in ops:
        if n:
            acc = by_op.setdefault(key.split(" ")[0], [0.0, 0.0])
            acc[0] += n * t_torch
            acc[1] += n * t_tuned
    losing = sorted(op for op, (torch_s, tuned_s) in by_op.items() if tuned_s > torch_s * (1 + SAME_WITHIN))
    if not losing:
        return None
    keep = sorted(set(by_op) - set(losing))
    said = "; ".join(f"{op} {by_op[op][1] * 1e6:.1f} us tuned against {by_op[op][0] * 1e6:.1f} us for torch's "
                     f"in a forward" for op in losing)
    how = (f"runtime.patch(model, table, ops={_names(keep)})" if keep
           else "route none of them: run the model unpatched in eager mode")
    return f"in eager mode {', '.join(losing)} cost more routed than torch's own ({said}): {how}"


def compile_advice(ops: list[str], singles: list[tuple[str, float, float]]) -> str:
    """What to pass `runtime.patch(..., under_compile=)` after patched + torch.compile measured
    slower than torch.compile: the ops that were faster routed alone than left to the compiler
    (by more than SAME_WITHIN), or none."""
    keep = sorted(op for op, t, t_compile in singles if t < t_compile * (1 - SAME_WITHIN))
    measured = "".join(f"; only {op} routed: {t_compile / t:.2f}x torch.compile" for op, t, t_compile in singles)
    if keep:
        return (f"under torch.compile, route only {', '.join(keep)}: runtime.patch(model, table, "
                f"under_compile={_names(keep)}){measured}")
    return (f"under torch.compile, leave {', '.join(ops)} to the compiler (routed in eager mode only): "
            f"runtime.patch(model, table, under_compile=()){measured}")
