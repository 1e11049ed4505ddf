"""`tuner profile ... --emit sweep.yaml`: the hot operators of a profile as work to tune.

An operator instance that a library op computes exactly (`profile.library_match`) becomes a
task of the sweep (op, shape, dtype). Any other becomes a KernelBench-format problem file in
a folder beside the sweep, reproducing the recorded call (`torch.ops.aten.<op>` on inputs of
the recorded shapes and dtypes, with the recorded scalar arguments): tune it with your own
skeleton (a `problem:` entry with `template:` and `space:`, listed commented out in the sweep
file) or let a model write one (`tuner tune --op FILE --llm MODEL`). The files' sizes are
module-level constants, one per distinct extent (extents of equal value share one, as a
matmul's K does), so `--size` resizes them consistently.

A model's own module that the profile shows whole ("class::<name>": a leaf without buffers
whose forward runs several aten ops, such as an activation written as a formula, or a norm
with its weight) becomes a problem file whose Model is that module, made again from its
recipe (`tuner.serve.extracted`; its parameters drawn at the shapes it had), which the file
keeps as `MODULE`: `runtime.patch` puts the kernel tuned for the file in place of every such
module of a model.

Not extracted, and said so in the sweep file: calls with integer or boolean tensor inputs (the
values that are valid, e.g. indices below a table's length, are the model's to know), in-place
ops, and calls the record cannot rebuild.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tuner.model.profile import OpRow, Profile, library_calls, meta_call

_TORCH = {"fp32": "torch.float32", "fp64": "torch.float64", "fp16": "torch.float16", "bf16": "torch.bfloat16"}


def problem_source(row: OpRow, model: str) -> str | None:
    """A problem file reproducing `row`'s call, or None (see the module docstring for why not)."""
    name = row.aten.split("::", 1)[1]
    rebuilt = meta_call(row)
    if name.endswith("_") or rebuilt is None:
        return None
    tensors = [a for a in row.args if a.is_tensor]
    if not tensors or any(a.dtype not in _TORCH for a in tensors):
        return None
    sizes: dict[int, str] = {}
    for a in tensors:
        for extent in a.shape:
            sizes.setdefault(extent, f"n{len(sizes)}")
    lines = [f'"""{row.aten} as {model} calls it: inputs {row.shapes} ({row.dtypes}); {row.calls} call(s) per',
             f"iteration, {row.share:.1%} of the model's time when profiled (tuner profile). The sizes are one",
             'constant per distinct extent: --size NAME=VALUE changes every dim that had that extent."""',
             "", "import torch", "import torch.nn as nn", ""]
    lines += [f"{n} = {v}" for v, n in sizes.items()]
    params, call, draws = [], [], []
    k = 0
    first_keyword = rebuilt.n_args - len(rebuilt.keywords)
    for i, a in enumerate(row.args[:rebuilt.n_args]):  # trailing Nones that stand for defaults left out
        by = f"{rebuilt.keywords[i - first_keyword]}=" if i >= first_keyword else ""  # keyword-only in the schema
        if a.is_tensor:
            params.append(f"in{k}")
            call.append(f"{by}in{k}")
            dims = ", ".join(sizes[e] for e in a.shape)
            draws.append(f"torch.randn({dims}{',' if len(a.shape) == 1 else ''}).to({_TORCH[a.dtype]})"
                         if a.shape else f"torch.randn(()).to({_TORCH[a.dtype]})")
            k += 1
        else:
            v = list(a.value) if isinstance(a.value, tuple) else a.value
            call.append(f"{by}{v!r}")
    lines += ["", "", "class Model(nn.Module):",
              f"    def forward(self, {', '.join(params)}):",
              f"        return torch.ops.aten.{name}({', '.join(call)})",
              "", "", "def get_inputs():", f"    return [{', '.join(draws)}]",
              "", "", "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)


def module_problem_source(row: OpRow, recipe: dict, model: str) -> str | None:
    """A problem file whose Model is the module `recipe` describes, on inputs of `row`'s
    shapes (floating tensors only), or None."""
    tensors = [a for a in row.args if a.is_tensor]
    if not tensors or len(tensors) != len(row.args) or any(a.dtype not in _TORCH for a in tensors):
        return None
    sizes: dict[int, str] = {}
    shapes = recipe.get("shapes", {})  # the module's parameters'
    for shape in [a.shape for a in tensors] + list(shapes.values()):
        for extent in shape:
            sizes.setdefault(extent, f"n{len(sizes)}")
    params = [f"in{k}" for k in range(len(tensors))]
    made = "build(MODULE" + (", {" + ", ".join(f"{n!r}: ({''.join(sizes[e] + ', ' for e in shape).rstrip(' ')})"
                                                 for n, shape in shapes.items()) + "})" if shapes else ")")
    draws = [f"torch.randn({', '.join(sizes[e] for e in a.shape)}{',' if len(a.shape) == 1 else ''}).to({_TORCH[a.dtype]})"
             if a.shape else f"torch.randn(()).to({_TORCH[a.dtype]})" for a in tensors]
    lines = [f'"""{row.aten[len("class::"):]} as {model} calls it, whole: inputs {row.shapes} ({row.dtypes}); '
             f"{row.calls} call(s) per",
             f"iteration, {row.share:.1%} of the model's time when profiled (tuner profile). The Model is the model's",
             "own module, made again from MODULE (its class and attributes), which `runtime.patch` reads to put",
             "the kernel tuned here in place of each such module. The sizes are one constant per distinct",
             'extent: --size NAME=VALUE changes every dim that had that extent."""',
             "", "import torch", "import torch.nn as nn", "", "from tuner.serve.extracted import build", ""]
    lines += [f"{n} = {v}" for v, n in sizes.items()]
    source = recipe.get("source")
    if source:
        lines += ["", "# What the kernel computes: the module's class, as its source has it:"]
        lines += [f"#   {line}".rstrip() for line in source.rstrip().splitlines()]
    lines += [f"MODULE = {({k: v for k, v in recipe.items() if k not in ('source', 'shapes')})!r}", "", "",
              "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()",
              f"        self.module = {made}", "",
              f"    def forward(self, {', '.join(params)}):", f"        return self.module({', '.join(params)})",
              "", "", "def get_inputs():", f"    return [{', '.join(draws)}]",
              "", "", "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)


def emit_sweep(profile: Profile, out: str | Path, backend: str | None = None, top: int = 10,
               min_share: float = 0.01, also=None) -> Path:
    """Write the sweep file `out` (and its problem files beside it) for the `top` hottest rows
    with at least `min_share` of the model's time; return its path. `also(op, shape, dtype)`:
    the backend's other languages whose library skeleton can run that call (cuda: CUDA C++),
    each a task of its own beside the default language's (`tuner db update` keeps both; the runtime serves the faster)."""
    out = Path(out)
    folder = out.parent / f"{out.stem}_problems"
    hot = [r for r in profile.rows[:top] if r.share >= min_share]
    ops: dict[str, dict] = {}
    comments: list[str] = []
    for i, row in enumerate(hot, 1):
        if row.library is not None:
            for op, shape, dtype in library_calls(row):
                entry = ops.setdefault(f"{op}-{dtype}", {"op": op, "shapes": [], "dtypes": [dtype]})
                if shape not in entry["shapes"]:
                    entry["shapes"].append(shape)
                for lang in (also(op, shape, dtype) if also else ()):
                    entry = ops.setdefault(f"{op}-{dtype}-{lang}", {"op": op, "language": lang, "shapes": [],
                                                                   "dtypes": [dtype]})
                    if shape not in entry["shapes"]:
                        entry["shapes"].append(shape)
            continue
        if row.aten.startswith("module::"):  # a module the patch routes to a library op
            from tuner.core.skeleton import library_skeletons
            op = row.aten.split("::", 1)[1]
            comments.append(f"# {row.aten} at {row.shapes} ({row.share:.1%} of the time): the library's {op} "
                            f"has no skeleton in this backend's language (it has: "
                            f"{', '.join(sorted(library_skeletons().get(op, ()))) or 'none'})")
            continue
        recipe = profile.recipe(row) if row.aten.startswith("class::") else None
        source = (module_problem_source(row, recipe, Path(profile.model).name) if recipe is not None
                  else problem_source(row, Path(profile.model).name))
        if source is None:
            comments.append(f"# not extracted: {row.aten} at {row.shapes} ({row.share:.1%}): integer inputs, "
                            f"in place, or not rebuildable from the record")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        stem = row.aten.split("::", 1)[1].split("(", 1)[0]
        path = folder / f"{i:02d}_{re.sub(r'[^A-Za-z0-9_]', '_', stem)}.py"
        path.write_text(source)
        rel = path.relative_to(out.parent)
        comments.append(f"# {row.aten} at {row.shapes} ({row.share:.1%} of the time): no library skeleton; "
                        f"tune {rel} with yours or a model's:")
        comments.append(f"#   {path.stem}: {{problem: {rel}, template: YOUR.j2, space: YOUR.yaml}}")
        comments.append(f"#   or: tuner tune --op {rel} --llm MODEL")
    plan: dict = {"name": out.stem}
    if backend:
        plan["backend"] = backend
    plan["ops"] = ops or {}
    head = (f"# Written by `tuner profile {profile.model}` ({profile.device}): the hot operators that a\n"
            f"# library skeleton computes exactly, at the shapes the model used. Run: tuner sweep {out.name}\n")
    text = head + yaml.safe_dump(plan, sort_keys=False) + ("\n" + "\n".join(comments) + "\n" if comments else "")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
