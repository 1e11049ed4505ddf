"""Triton's interpreter held to the launch's own tensors (tuner/backends/interpreter_bounds.py):
under it a kernel's loads and stores are raw accesses of the judging process."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

# Each kernel takes a buffer, an output, an element offset and a lane count; `launch` runs one
# program of it on (x, y, off, n). The honest one is masked past n.
KERNELS = {
    "masked": "v = tl.load(x_ptr + off + i, mask=i < n, other=0.0)\n    tl.store(y_ptr + i, v, mask=i < n)",
    "read": "v = tl.load(x_ptr + off + i)\n    tl.store(y_ptr + i, v)",
    "write": "tl.store(x_ptr + off + i, i.to(tl.float32))",
    "atomic": "tl.atomic_add(x_ptr + off + i, 1.0, mask=i < n)",
    # A descriptor made in the kernel that claims more rows than its base holds.
    "descriptor": "t = tl.make_tensor_descriptor(x_ptr, shape=[n, 16], strides=[16, 1], block_shape=[16, 16])"
                  ".load([off, 0])\n    tl.store(y_ptr + i, tl.sum(t, 0))",
    # A pointer made of an integer: the address of another tensor, handed in by the launch.
    "forged": "p = (x_ptr.to(tl.int64, bitcast=True) + off * 4).to(tl.pointer_type(tl.float32), bitcast=True)\n"
              "    tl.store(y_ptr + i, tl.load(p + i))",
}
SOURCE = """
import triton
import triton.language as tl


@triton.jit
def kernel(x_ptr, y_ptr, off, n):
    i = tl.arange(0, 16)
    BODY


def launch(x, y, off, n):
    kernel[(1,)](x, y, off, n)
"""


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    from tuner.backends.interpreter_bounds import bound_interpreter
    from tuner.backends.triton_source import load_module
    bound_interpreter()
    folder = tmp_path_factory.mktemp("bounds")
    out = {}
    for name, body in KERNELS.items():
        (folder / f"{name}.py").write_text(SOURCE.replace("BODY", body))
        out[name] = load_module(folder / f"{name}.py", f"tuner_bounds_{name}").launch
    yield out
    mp.undo()


def test_masked_lanes_past_the_end_are_not_accesses(launches):
    x, y = torch.arange(16, dtype=torch.float32), torch.zeros(16)
    launches["masked"](x[:10], y, 0, 10)  # a view: its lanes past 10 masked off
    launches["atomic"](x, y, 0, 16)
    assert y[:10].tolist() == list(range(10)) and x[0] == 1


@pytest.mark.parametrize("name,what", [("read", "load"), ("write", "store"), ("atomic", "atomic"),
                                       ("descriptor", "load")])
def test_an_access_past_the_end_is_refused(launches, name, what):
    x, y = torch.zeros(16), torch.zeros(16)
    with pytest.raises(Exception, match=f"a {what} outside the tensors the launch passed"):
        launches[name](x, y, 1, 16)  # lane 15 reaches one element past x


@pytest.mark.parametrize("name", ["read", "write", "forged"])
def test_another_tensor_of_the_process_is_out_of_reach(launches, name):
    """What the judge holds (a reference, say) is a tensor the launch did not pass."""
    x, y = torch.zeros(16), torch.zeros(16)
    secret = torch.arange(16, dtype=torch.float32) + 100
    off = (secret.data_ptr() - x.data_ptr()) // 4
    with pytest.raises(Exception, match="outside the tensors the launch passed"):
        launches[name](x, y, off, 16)
    assert secret.tolist() == [100.0 + k for k in range(16)] and not y.any()


@pytest.mark.parametrize("addr,inside", [(1000, True), (1060, True), (1061, False), (999, False), (1064, False),
                                         (2**64 - 2, False)])  # the last: addr + 4 wraps past 2**64
def test_an_access_is_inside_only_with_all_its_bytes(addr, inside):
    import numpy as np

    from tuner.backends import interpreter_bounds as ib
    ib._state.ranges = (np.array([1000], dtype=np.uint64), np.array([1064], dtype=np.uint64))
    try:
        if inside:
            ib._check("load", np.array([addr], dtype=np.uint64), None, 4)
        else:
            with pytest.raises(ib.OutsideBuffers):
                ib._check("load", np.array([addr], dtype=np.uint64), None, 4)
    finally:
        ib._state.ranges = None
