"""Sizes of a problem file are what they say: an override sets the size where the file writes
it, so what the file derives from it at import follows; a size the file computes is refused
with the line to change; templates can name the inputs' actual extents."""

import pytest

from tuner.core.op import OpError
from tuner.core.ops import BUILTINS, arg_specs, builtin_spec, load_op, render_context, torch_dtype
from tuner.core.problem import size_positions, spec_from_problem_file

PROBLEM = """import torch
import torch.nn as nn

batch_size = 8
num_classes = 16
input_shape = (num_classes,)
hidden = 2 * num_classes


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return []
"""


@pytest.fixture
def problem(tmp_path):
    p = tmp_path / "derived.py"
    p.write_text(PROBLEM)
    return p


def test_an_override_reaches_what_the_file_derives_from_the_size(problem):
    spec = spec_from_problem_file(problem, "fp32", {"num_classes": 1024})
    assert dict(spec.sizes) == {"batch_size": 8, "num_classes": 1024, "hidden": 2048}
    op = load_op(spec)
    assert [tuple(x.shape) for x in op.make_inputs(0)] == [(8, 1024)]
    ctx = render_context(op)
    assert ctx["in0_dim1"] == 1024 and ctx["out0_dim0"] == 8
    assert size_positions(problem, dict(spec.sizes)) == {"batch_size": (0, 0), "num_classes": (0, 1)}


def test_a_computed_size_is_refused_with_the_line_to_change(problem):
    with pytest.raises(OpError, match=r"derived.py:7: hidden is set by `hidden = 2 \* num_classes`"):
        spec_from_problem_file(problem, "fp32", {"hidden": 10})
    # Asked for the value it comes to, it is no change at all.
    assert dict(spec_from_problem_file(problem, "fp32", {"hidden": 32}).sizes)["hidden"] == 32


def test_a_size_set_twice_or_missing_is_refused(problem):
    problem.write_text(PROBLEM.replace("hidden = 2 * num_classes", "hidden = 2 * num_classes\nbatch_size += 1"))
    with pytest.raises(OpError, match="batch_size is set by `batch_size \\+= 1`"):
        spec_from_problem_file(problem, "fp32", {"batch_size": 4})
    with pytest.raises(OpError, match="no module-level integer 'nope'"):
        spec_from_problem_file(problem, "fp32", {"nope": 4})


def test_a_size_the_file_never_reads_is_refused(problem):
    problem.write_text(PROBLEM.replace("torch.randn(batch_size, *input_shape)", "torch.randn(8, 16)"))
    with pytest.raises(OpError, match="--size batch_size=... changes nothing: the file sets batch_size but never reads it"):
        spec_from_problem_file(problem, "fp32", {"batch_size": 4})


def _problem_files():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    return sorted(p for d in (root / "bench/llm_problems", root / "tests/fixtures/kernelbench")
                  for p in d.glob("*.py") if p.name != "broken.py")


@pytest.mark.parametrize("path", _problem_files(), ids=lambda p: p.stem)
def test_compile_shapes_from_meta_tensors_are_the_live_ops(path):
    """Compile workers take a problem file's argument shapes from its Model run on meta tensors
    (nothing drawn or computed); they must be the ones the harness allocates, or a kernel is
    compiled for a specialization it is never launched with."""
    from tuner.core.ops import arg_specs
    from tuner.core.problem import shape_only_arg_specs
    for dtype in ("bf16",):
        spec = spec_from_problem_file(path, dtype)
        light = shape_only_arg_specs(spec)
        assert light is not None, path.name
        assert light == tuple(arg_specs(load_op(spec))) or list(light) == list(arg_specs(load_op(spec)))


@pytest.mark.parametrize("path", _problem_files(), ids=lambda p: p.stem)
def test_a_workers_op_from_meta_tensors_is_its_parents(path, monkeypatch):
    """A worker process (its parent ran the Model on real inputs) builds the op from meta
    tensors: the same names, outputs, FLOPs and bytes, with nothing drawn or computed."""
    from tuner.core import ops, problem
    spec = spec_from_problem_file(path, "bf16")
    parent = problem.problem_op(spec)
    monkeypatch.setattr(problem, "CHECKED_ELSEWHERE", True)
    monkeypatch.setattr(ops, "_CACHE", {})
    worker = problem.problem_op(spec)
    assert (worker.input_names, worker.output_names, worker.flops, worker.bytes) == \
        (parent.input_names, parent.output_names, parent.flops, parent.bytes)


def test_a_file_that_cannot_run_on_meta_gets_no_shape_only_answer(tmp_path):
    from tuner.core.problem import shape_only_arg_specs
    p = tmp_path / "hostonly.py"
    p.write_text(PROBLEM.replace("return torch.softmax(x, dim=1)", "return x + float(x.sum())"))
    assert shape_only_arg_specs(spec_from_problem_file(p)) is None


def test_worker_processes_skip_only_what_their_parent_checked(tmp_path, monkeypatch):
    """A worker (CHECKED_ELSEWHERE) builds the op without running the Model a second time for
    the determinism check its parent ran; the memory checker (COUNT_FLOPS off) without torch's
    FLOP counter. The parent itself still refuses a Model that is not deterministic."""
    from tuner.core import ops, problem
    p = tmp_path / "noisy.py"
    p.write_text(PROBLEM.replace("return torch.softmax(x, dim=1)", "return x + torch.rand_like(x)"))
    spec = spec_from_problem_file(p)
    with pytest.raises(OpError, match="not deterministic"):
        problem.problem_op(spec)
    monkeypatch.setattr(problem, "CHECKED_ELSEWHERE", True)
    monkeypatch.setattr(problem, "COUNT_FLOPS", False)
    monkeypatch.setattr(ops, "_CACHE", {})
    op = load_op(spec)
    assert op.flops is None and op.output_names == ("out0",)


def test_inputs_are_drawn_where_they_are_wanted_or_on_the_host_if_they_cannot_be(tmp_path):
    """A problem file's get_inputs() runs with torch's default device set to where the inputs
    are wanted (a GPU draws its own 64M-element set in milliseconds; drawn on the host and
    moved, a second per set); one that cannot run there (numpy) is drawn on the host and moved.
    Either way the parameters come along, redrawn, and the host's draws are what they were."""
    import torch
    from tuner.core import problem
    p = tmp_path / "norm.py"
    p.write_text(PROBLEM.replace("return torch.softmax(x, dim=1)", "return self.ln(x)").replace(
        "class Model(nn.Module):\n", "class Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.ln = nn.LayerNorm(num_classes)\n\n"))
    op = problem.problem_op(spec_from_problem_file(p))
    on_meta = op.make_inputs(5, "meta")
    assert [t.device.type for t in on_meta] == ["meta"] * 3
    host = op.make_inputs(5)
    assert all(torch.equal(a, b) for a, b in zip(host, op.make_inputs(5)))
    assert not torch.equal(host[1], torch.ones(16))  # LayerNorm's weight, redrawn

    q = tmp_path / "numpy_inputs.py"
    q.write_text(PROBLEM.replace("return [torch.randn(batch_size, *input_shape)]",
                                 "return [torch.from_numpy(np.random.default_rng(torch.randint(9, (1,)).item())"
                                 ".standard_normal((batch_size, num_classes)).astype('float32'))]")
                 .replace("import torch\n", "import numpy as np\nimport torch\n", 1))
    op = problem.problem_op(spec_from_problem_file(q))
    xs = op.make_inputs(3, "meta")
    assert xs[0].device.type == "meta" and xs[0].shape == (8, 16)  # drawn on the host, moved


@pytest.mark.cuda
def test_a_gpu_draws_a_problem_files_inputs_itself_the_same_for_the_same_seed(tmp_path):
    import torch
    from tuner.core import problem
    p = tmp_path / "derived.py"
    p.write_text(PROBLEM)
    op = problem.problem_op(spec_from_problem_file(p))
    a, b = op.make_inputs(7, "cuda"), op.make_inputs(7, "cuda")
    assert a[0].device.type == "cuda" and torch.equal(a[0], b[0])
    assert not torch.equal(a[0], op.make_inputs(8, "cuda")[0])


def test_the_template_can_read_what_get_init_inputs_gives_the_model(fixtures):
    """Linear(in_features, out_features): sizes the Model's constructor is given, by position
    (init0, init1) and by the constructor's parameter names."""
    ctx = render_context(load_op(spec_from_problem_file(fixtures / "kernelbench/linear.py")))
    assert (ctx["in_features"], ctx["out_features"], ctx["init0"], ctx["init1"]) == (64, 32, 64, 32)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_a_builtins_written_argument_shapes_are_what_its_op_makes(name):
    """`arg_specs` reads a built-in's shapes from BUILTIN_ARGS (no torch op runs); they must be
    what its inputs and its reference give, at odd sizes where a swapped dim would show."""
    import torch
    sizes = dict(zip(BUILTINS[name].size_names, (6, 10, 14, 8, 12)))
    if name == "attention_decode":
        sizes.update(H=8, KH=2)
    for dtype in ("fp32", "bf16"):
        op = load_op(builtin_spec(name, "x".join(str(sizes[k]) for k in BUILTINS[name].size_names), dtype))
        xs = op.make_inputs(0)
        outs = op.reference([x.double() if x.is_floating_point() else x for x in xs])
        made = ([(tuple(x.shape), x.dtype) for x in xs],
                [(tuple(o.shape), torch_dtype(dtype) if o.is_floating_point() else o.dtype) for o in outs])
        assert arg_specs(op) == made
        assert all(dt is torch.int64 or dt == torch_dtype(dtype) for _, dt in made[0] + made[1])
