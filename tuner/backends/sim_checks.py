"""What holds the sim backend's modelled time to the truth: a module's ASCEND_COST against
the op (`short_of_the_op`, when compiled) and against what the kernel did when metered
(`understated`, over sim_meter.Traffic), and the outputs of a metered run against the op's
reference (`poisoned_copies` before the run, `wrong_where_written` after). Pure functions of
their arguments; the backend (sim.py) decides when each runs."""

from __future__ import annotations

import math

# `cost` arguments are ascend_model.Cost.


def declared_program(cost) -> tuple[float, float, float]:
    """What an ASCEND_COST says its busiest program does (a program with ceil(tiles / programs)
    tiles), unpadded: (bytes moved GM<->on-core, transfers, cube flops)."""
    per = -(-cost.tiles // cost.programs)

    def nbytes(pairs) -> float:
        return sum(b * n for b, n in pairs)

    def count(pairs) -> float:
        return sum(n for b, n in pairs if b > 0)
    steps_b = nbytes(cost.step_load) + nbytes(cost.step_store)
    steps_n = count(cost.step_load) + count(cost.step_store)
    tile_b = (nbytes(cost.tile_load) + nbytes(cost.tile_store) + cost.tile_out + cost.mix_load + cost.mix_store)
    tile_n = (count(cost.tile_load) + count(cost.tile_store)
              + sum(1 for v in (cost.tile_out, cost.mix_load, cost.mix_store) if v > 0))
    flops = 2.0 * math.prod(cost.step_cube) * cost.steps if cost.step_cube else 0.0
    return (per * (cost.steps * steps_b + tile_b) + nbytes(cost.setup_load),
            per * (cost.steps * steps_n + tile_n) + count(cost.setup_load), per * flops)


def declared_vector(cost) -> float:
    """The fp32 vector element-operations an ASCEND_COST says its busiest program does."""
    return -(-cost.tiles // cost.programs) * (cost.steps * cost.step_vector + cost.tile_vector + cost.mix_vector)


def declared_total(cost) -> tuple[float, float]:
    """What an ASCEND_COST says the whole launch does, unpadded: (bytes moved GM<->on-core,
    cube flops)."""
    def nbytes(pairs) -> float:
        return sum(b * n for b, n in pairs)
    per_tile = (cost.steps * (nbytes(cost.step_load) + nbytes(cost.step_store)) + nbytes(cost.tile_load)
                + nbytes(cost.tile_store) + cost.tile_out + cost.mix_load + cost.mix_store)
    flops = 2.0 * math.prod(cost.step_cube) * cost.steps if cost.step_cube else 0.0
    return cost.tiles * per_tile + cost.programs * nbytes(cost.setup_load), cost.tiles * flops


# A declaration's totals may fall this far short of the op's own figures (rounding, an average
# store count) before it is refused.
FLOOR_SLACK = 0.02


def short_of_the_op(cost, op_bytes: float | None, op_flops: float | None) -> str | None:
    """Why `cost` declares less than any kernel of the op must do, or None. Whatever its
    programs do, a kernel reads every input and writes every output once (the op's bytes), and
    a matmul's cube does its 2 m n k flops: a declaration below that (a launch that "moves" a
    fraction of its operands, distinct bytes declared smaller than the operands so that the
    rest is modelled as L2 hits) would be modelled faster than any kernel can be. This floor
    holds what no sample of programs can see: the work put in the programs the meter skips."""
    total_bytes, total_flops = declared_total(cost)
    floor = 1 - FLOOR_SLACK
    if op_bytes and total_bytes < op_bytes * floor:
        return (f"sim: error: ASCEND_COST declares {total_bytes:.0f} bytes moved by the whole launch "
                f"(tiles x per-tile transfers + programs x setup_load), less than the op's own "
                f"inputs and outputs ({op_bytes:.0f} bytes): every input is read and every output "
                f"written at least once, so the declaration must cover them")
    if op_bytes and 0 < cost.unique_bytes < op_bytes * floor:
        return (f"sim: error: ASCEND_COST declares unique_bytes={cost.unique_bytes:.0f}, less than the "
                f"op's own inputs and outputs ({op_bytes:.0f} bytes), which are distinct GM bytes "
                f"the kernel must touch; leave it out (the op's bytes) or declare at least that")
    if op_flops and cost.step_cube is not None and total_flops < op_flops * floor:
        return (f"sim: error: ASCEND_COST declares {total_flops:.3g} cube flops for the whole launch "
                f"(tiles x steps x 2 m n k of step_cube), less than the matmul's own {op_flops:.3g}")
    return None


# A metered program may move this much more than its declaration says (rounding in a
# template's figures, a masked tail counted by its lanes) before the declaration is refused.
METER_SLACK = 0.10
METER_SLACK_BYTES = 4096
# Vector work is declared as an estimate (the library's declarations are 1-1.6x what the
# interpreter counts, which leaves out reductions); scalar float operations add a few per step.
METER_VECTOR_SLACK = 0.25
METER_VECTOR_SLACK_OPS = 1024
# Index, mask and cast operations per byte a program moves (the library's kernels: at most
# 3.6 at small shapes, where masked lanes weigh most): far more is a loop the model cannot
# see (and, under the interpreter, a way to spend the meter's time before the first load).
OTHER_OPS_PER_BYTE = 16
OTHER_OPS_SLACK = 1 << 16
# Counted in operations as well: a loop of scalar arithmetic (integer or float) is few
# elements but many operations, and within the meter's time budget a loaded machine interprets
# too few of them to pass the element slacks. The library's kernels make up to about 40
# element-wise operations and reductions per load, store or dot (a chunked softmax or
# layernorm).
OPS_PER_MOVE = 256
OPS_SLACK = 2048


def understated(cost, traffic) -> str | None:
    """Why `cost` understates what the kernel did when metered (sim_meter.Traffic), or None.
    A meter stopped by its time budget counted part of a program: a lower bound, which refuses
    only what it already exceeds."""
    busiest = traffic.busiest()
    if busiest is None:
        return None
    (kernel, idx), p = busiest
    d_bytes, d_transfers, d_flops = declared_program(cost)
    where = f"program {idx} of {kernel}" + ("" if traffic.complete else " (in the part metered)")
    if p.bytes > d_bytes * (1 + METER_SLACK) + METER_SLACK_BYTES:
        return (f"ASCEND_COST understates the kernel's traffic: {where} moved {p.bytes} bytes "
                f"({p.loads} loads, {p.stores} stores), the description says a program moves at "
                f"most {d_bytes:.0f}; the simulator models the declared costs, so they must "
                f"cover what the kernel does")
    if p.transfers > d_transfers * (1 + METER_SLACK) + 2:
        return (f"ASCEND_COST understates the kernel's transfers: {where} made {p.transfers} loads and "
                f"stores, the description declares {d_transfers:.0f} (each load or store is at least "
                f"one transfer)")
    most = max((q.dot_flops for q in traffic.programs.values()), default=0.0)
    if most > d_flops * (1 + METER_SLACK) + 1:
        return (f"ASCEND_COST understates the kernel's cube work: a program's tl.dot calls did "
                f"{most:.3g} flops, the description declares {d_flops:.3g} per program")
    vec = max(traffic.programs.items(), key=lambda kv: kv[1].vector_ops)
    d_vector = declared_vector(cost)
    if vec[1].vector_ops > d_vector * (1 + METER_VECTOR_SLACK) + METER_VECTOR_SLACK_OPS:
        (kernel, idx), p = vec
        return (f"ASCEND_COST understates the kernel's vector work: program {idx} of {kernel}"
                + ("" if traffic.complete else " (in the part metered)")
                + f" did {p.vector_ops} float element-operations (arithmetic, exp/log/sqrt, min/max; "
                f"reductions not counted), the description declares {d_vector:.0f} for its busiest "
                f"program (tiles per program x (steps x step_vector + tile_vector + mix_vector))")
    for (kernel, idx), p in traffic.programs.items():
        where = f"program {idx} of {kernel}" + ("" if traffic.complete else " (in the part metered)")
        if p.other_ops > OTHER_OPS_PER_BYTE * (p.bytes + p.vector_ops + p.dot_flops / 64) + OTHER_OPS_SLACK:
            return (f"the kernel does work the simulator's model has no term for: {where} did "
                    f"{p.other_ops} integer, compare and cast element-operations for the "
                    f"{p.bytes} bytes it moved and its {p.vector_ops} float operations (the "
                    f"library's kernels do at most 4 a byte in index and mask arithmetic)")
        if p.op_calls > OPS_PER_MOVE * p.move_calls + OPS_SLACK:
            return (f"the kernel does work the simulator's model has no term for: {where} made "
                    f"{p.op_calls} element-wise operations for its {p.move_calls} loads, stores and "
                    f"dots (a loop of scalar arithmetic; the library's kernels make up to about 40 "
                    f"per load, store or dot)")
    return None


def poisoned_copies(op, args: list) -> tuple[list, list]:
    """Copies of a launch's arguments with each output filled with the harness's random poison,
    always its finite kind (a far value drawn at random, as half the checked launches' outputs
    hold: a metered run looks like one of those); and the poisons. What a partial run of the
    kernel (a sample of its programs) leaves holding the poison, it did not write; a NaN
    poison would make a kernel that writes NaN read as one that wrote nothing, and escape."""
    from tuner.core.tolerance import poison
    copies = [a.clone() for a in args]
    n_in = len(op.input_names)
    poisons = [poison(c.dtype, finite=True) for c in copies[n_in:]]
    for c, p in zip(copies[n_in:], poisons):
        c.fill_(p)
    return copies, poisons


def wrong_where_written(op, inputs: list, outs: list, poisons: list, whole: bool) -> str | None:
    """Why what a kernel wrote into `outs` (each filled with its `poisons` value before it ran:
    `poisoned_copies`) is not the op's result on `inputs`, or None. `whole`: every program
    ran, so every element must have been written; otherwise only the written ones are held to
    the reference (a program the sample left out wrote nothing here). An element that holds
    the poison and is right anyway (the poison happened to be the answer) is right. The
    float64 reference and the tolerance are the harness's (the op's, raised to 8x torch's own
    error in the dtype)."""
    import math

    import torch

    from tuner.core.tolerance import torch_slack
    xs = [x.double() if x.is_floating_point() else x for x in inputs]
    refs = [r.double() if r.is_floating_point() else r for r in op.reference(xs)]
    slack = torch_slack(op, list(inputs), refs) or [0.0] * len(refs)
    atol, rtol = op.tolerance
    for name, o, r, p, floor in zip(op.output_names, outs, refs, poisons, slack):
        if tuple(o.shape) != tuple(r.shape):
            return f"output {name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        o64 = o.double()
        r64 = r.double()
        held = torch.isnan(o64) if isinstance(p, float) and math.isnan(p) else (o == p)
        tol = (max(atol, floor) + rtol * r64.abs()) if o.is_floating_point() else 0.0
        off = ~((o64 - r64).abs() <= tol) & ~(torch.isnan(o64) & torch.isnan(r64))
        if whole:
            unwritten = int((held & off).sum())
            if unwritten:
                return (f"output {name}: {unwritten} of {o.numel()} elements never written when every "
                        f"program of the kernel ran (they still hold the value the buffer was filled "
                        f"with before the launch)")
        bad = ~held & off
        if bad.any():
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            return (f"output {name}: {int(bad.sum())} of the {int((~held).sum())} elements the metered "
                    f"programs wrote are off; first at {idx}: got {float(o64[idx]):.6g}, expected "
                    f"{float(r64[idx]):.6g} (atol {max(atol, floor):g}, rtol {rtol:g})")
    return None
