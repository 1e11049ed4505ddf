"""One kernel checker: the skeleton writer and the backends give the same verdict on a source."""

import random

import pytest

from tests.test_cuda_backend import GOOD
from tests.test_proposer import SPACE, kit
from tuner.codecheck import TRITON, TRITON_ASCEND, Forbidden, check_python, check_source, require_clean
from tuner.llm.proposer import Rejection, check_candidate

# Each breaks the launch-module contract; the two checkers disagreed on the first two.
CHEATS = {
    # A decorator named like the JIT but defined here: the "kernel" is host Python (torch compute).
    "own jit": GOOD.replace("SCALE = 2.0", "SCALE = 2.0\n\ndef jit(f):\n    return f")
                   .replace("@triton.jit", "@jit"),
    # An attribute path from triton.language into another module.
    "path to builtins": GOOD.replace("    n = x.numel()", "    n = x.numel()\n    tl.core.builtins.exec('1')"),
    # The same module imported under a name of its own, with no attribute taken yet.
    "import of builtins": GOOD.replace("SCALE = 2.0", "SCALE = 2.0").replace(
        "import math\n", "import math\nfrom triton.language.core import builtins as b\n"),
    "host lambda call": GOOD.replace("    n = x.numel()", "    n = (lambda: x.sum())()"),
    "torch in a kernel": GOOD.replace("    offs = tl.program_id(0)", "    t = torch.float32\n    offs = tl.program_id(0)"),
    # Expressions Python runs that the checker once did not read: a nested function's decorator
    # (run when `launch` defines it) and a module-level annotation (run on import).
    "nested decorator": GOOD.replace("    n = x.numel()", "    @__import__('os').system('true')\n    def f():\n"
                                     "        pass\n    n = x.numel()"),
    "nested jit": GOOD.replace("    n = x.numel()", "    @triton.jit\n    def f(p):\n        pass\n    n = x.numel()"),
    "module annotation": GOOD.replace("SCALE = 2.0", "SCALE: __import__('os').system('true') = 2.0"),
    # The kernel's own name bound to a tensor method: `k()` then passed as a call of the kernel.
    "rebound kernel name": GOOD.replace("    n = x.numel()", "    k = x.untyped_storage\n    n = k()"),
}


@pytest.mark.parametrize("name", CHEATS)
def test_the_skeleton_writer_and_the_backend_refuse_the_same_sources(name):
    source = CHEATS[name]
    findings = check_source("triton", source)
    assert findings, name
    with pytest.raises(Forbidden) as e:
        require_clean("triton", source)
    assert str(e.value).startswith("forbidden:") and f"(line {findings[0].line})" in str(e.value)
    template = source.replace("{", "{{ '{' }}").replace("}", "{{ '}' }}")
    with pytest.raises(Rejection) as r:
        check_candidate(SPACE.replace("language: script", "language: triton"), template, kit("cuda"),
                        random.Random(0))
    assert r.value.kind == "forbidden code" and r.value.line == findings[0].line


def test_a_clean_module_passes_both_policies():
    assert check_python(GOOD, TRITON) == []
    ascend = GOOD.replace("from triton.tools.tensor_descriptor import TensorDescriptor\n", "")
    assert check_python(ascend, TRITON_ASCEND) == []
    assert check_python(GOOD, TRITON_ASCEND)  # no host TMA descriptors on Ascend


def test_torch_npu_is_imported_for_its_device_and_nothing_is_taken_from_it():
    """Its functions are the vendor's fused kernels (npu_rms_norm): the op's work done by torch."""
    ascend = GOOD.replace("from triton.tools.tensor_descriptor import TensorDescriptor\n", "import torch_npu\n")
    assert check_python(ascend, TRITON_ASCEND) == []
    for change in ("    n = torch_npu.npu_rms_norm(x, y)", "    n = torch_npu.npu_format_cast"):
        whys = [f.why for f in check_python(ascend.replace("    n = x.numel()", change), TRITON_ASCEND)]
        assert any("from torch_npu only the import itself" in w for w in whys), whys
    whys = [f.why for f in check_python("from torch_npu import npu_rms_norm\n" + ascend, TRITON_ASCEND)]
    assert any("from torch_npu import npu_rms_norm" in w for w in whys), whys


def test_every_finding_is_reported_with_its_line():
    source = GOOD.replace("import math", "import os").replace("    n = x.numel()", "    n = eval('1')")
    whys = [(f.line, f.why) for f in check_python(source)]
    assert [line for line, _ in whys] == sorted(line for line, _ in whys) and len(whys) == 2
    assert "import os" in whys[0][1] and "'eval'" in whys[1][1]


def test_a_syntax_error_is_a_syntax_error():
    with pytest.raises(SyntaxError):
        require_clean("triton", "def launch(:")
    assert check_source("triton", "def launch(:")[0].syntax


# Under Triton's interpreter (the sim backend's checks) a kernel's body is Python run in the
# judging process: each of these kept a value from one launch to the next (shown running there;
# Triton's compiler refuses them on a device, so a real kernel needs none of them).
_KERNEL = "    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)"
KEPT = {
    "module list": (("SCALE = 2.0", "SCALE = 2.0\nKEPT = [0.0]"),
                    (_KERNEL, _KERNEL + "\n    KEPT[0] = tl.load(x_ptr)"), "a list as a module's constant"),
    "list in a tuple": (("SCALE = 2.0", "SCALE = 2.0\nKEPT = (1, [0.0])"), None, "a list as a module's constant"),
    "default list": (("def launch(x, y):", "def launch(x, y, kept=[]):"), None, "a list as a module's constant"),
    "kernel default": (("BLOCK: tl.constexpr)", "BLOCK: tl.constexpr, KEPT=[])"), None, "or a default"),
    "module attribute": ((_KERNEL, _KERNEL + "\n    math.kept = tl.load(x_ptr)"), None, "Triton has none"),
    "loop target": ((_KERNEL, _KERNEL + "\n    for math.i in range(2):\n        pass"), None, "Triton has none"),
    "language list": ((_KERNEL, _KERNEL + "\n    tl.dtype.SINT_TYPES.append(tl.load(x_ptr))"), None, ".SINT_TYPES"),
    "through a value": ((_KERNEL, _KERNEL + "\n    offs.dtype.SINT_TYPES.append(offs)"), None, ".SINT_TYPES"),
    "from the launch": (("    n = x.numel()", "    n = x.numel()\n    tl.dtype.SINT_TYPES.append(y)"), None,
                        ".SINT_TYPES"),
    "a JIT function's hooks": ((_KERNEL, _KERNEL + "\n    offs.sum.add_pre_run_hook(offs)"), None,
                               ".add_pre_run_hook"),
    "a JIT function run": (("    n = x.numel()", "    n = x.numel()\n    tl.sum.run(x)"), None, ".run"),
}


@pytest.mark.parametrize("name", KEPT)
def test_nothing_a_kernel_reaches_outlives_the_launch(name):
    first, second, words = KEPT[name]
    source = GOOD.replace(*first)
    assert source != GOOD, name
    if second:
        source = source.replace(*second)
    for policy in (TRITON, TRITON_ASCEND):
        text = source if policy is TRITON else source.replace(
            "from triton.tools.tensor_descriptor import TensorDescriptor\n", "")
        whys = [f.why for f in check_python(text, policy)]
        assert any(words in w for w in whys), (name, whys)


def test_what_a_kernel_legitimately_reads_on_its_values_passes():
    """The names the language's values answer to are not among those refused above."""
    body = ("    v = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)\n"
            "    t = v.type\n    d = y_ptr.dtype.element_ty\n    s = v.shape\n    w = v.sum(0) + v.max(0)\n"
            "    tl.store(y_ptr + offs, v.to(d), mask=offs < n)")
    assert _KERNEL in GOOD
    assert check_python(GOOD.replace(_KERNEL, body), TRITON) == []
