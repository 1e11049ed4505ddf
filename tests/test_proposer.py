"""Extracting and checking a model's skeleton, without compiling: every rejection is precise."""

import random

import pytest

from tuner.codecheck import check_c, check_python, check_source, check_template
from tuner.core.ops import builtin_spec, load_op, render_context
from tuner.core.values import DeviceInfo
from tuner.llm.prompt import PromptKit
from tuner.llm.proposer import Rejection, check_candidate, extract

SPACE = """language: script
sizes: [M, N]
params:
  BM: {pow2: [16, 64]}
  W: [1, 2, 4]
constraints:
  - BM <= M
default: {BM: 32, W: 2}
"""
TEMPLATE = "time: {{ 1e-5 * BM * W }}\n"


def kit(backend="null", op_name="softmax", shape="64x128"):
    spec = builtin_spec(op_name, shape)
    op = load_op(spec)
    lang = {"null": "script", "cpu": "c", "cuda": "triton", "sim": "triton_ascend"}[backend]
    extra = {"null": {"CORES": 4}, "cpu": {"ctype": "float", "CORES": 2}, "cuda": {"CORES": 132, "ARCH": 90},
             "sim": {"CORES": 40}}[backend]
    dev = DeviceInfo(backend, f"{backend} device", 4, limits=(("smem_bytes", 49152.0),),
                     peaks=(("copy_gbps", 100.0),))
    return PromptKit(spec, op, backend, lang, dev, {**render_context(op), **extra},
                     {"smem_bytes": 49152.0} if backend == "null" else {}, 1e-3)


def reject(space, template, k=None) -> Rejection:
    with pytest.raises(Rejection) as e:
        check_candidate(space, template, k or kit(), random.Random(0))
    return e.value


def test_extract_blocks():
    reply = f"Here you go.\n```yaml\n{SPACE}```\nand\n```jinja\n{TEMPLATE}```\n"
    assert extract(reply) == (SPACE, TEMPLATE)
    # untagged space, a thinking section with its own blocks, and a corrected second version
    reply2 = ("<think>```yaml\nparams: {X: [1]}\n```</think>\n```\n" + SPACE + "```\n```c\nold\n```\n"
              "```jinja\n" + TEMPLATE + "```")
    assert extract(reply2) == (SPACE, TEMPLATE)
    with pytest.raises(Rejection, match="no fenced code blocks.*cut off"):
        extract("I would write a kernel that", "length")
    with pytest.raises(Rejection, match="no template"):
        extract(f"```yaml\n{SPACE}```")
    with pytest.raises(Rejection, match="no ```yaml block"):
        extract(f"```jinja\n{TEMPLATE}```")


def test_valid_candidate_and_its_covering_configs():
    sk, configs = check_candidate(SPACE, TEMPLATE, kit(), random.Random(0), "softmax/script")
    assert sk.language == "script" and sk.space.get_meta("language") == "script"
    assert configs[0].as_dict() == {"BM": 32, "W": 2}
    seen = {(k, v) for c in configs for k, v in c.as_dict().items()}
    assert {("BM", 16), ("BM", 32), ("BM", 64), ("W", 1), ("W", 2), ("W", 4)} <= seen


def test_space_errors_name_the_line():
    r = reject(SPACE.replace("BM <= M", "BM <= Q"), TEMPLATE)
    assert r.kind == "invalid space" and r.line == 7 and r.text.strip() == "- BM <= Q" and "'Q'" in r.message
    r = reject(SPACE.replace("{pow2: [16, 64]}", "{pow2: [16, 60]}"), TEMPLATE)
    assert r.kind == "invalid space" and r.line == 4 and "powers of two" in r.message
    r = reject(SPACE.replace("params:", "parms:"), TEMPLATE)
    assert r.kind == "invalid space" and "parms" in r.message
    assert reject(SPACE.replace("language: script", "language: c"), TEMPLATE).kind == "wrong language"
    r = reject(SPACE.replace("[M, N]", "[M, K]"), TEMPLATE)
    assert r.kind == "unknown size" and "['K']" in r.message and "['M', 'N']" in r.message
    r = reject(SPACE.replace("  W:", "  N: [1, 2]\n  W:").replace("sizes: [M, N]", "sizes: [M]"), TEMPLATE)
    assert r.kind == "param named as a size" and "['N']" in r.message  # was a SpaceError out of the loop
    r = reject(SPACE.replace("  - BM <= M", "  - BM <= M\n  - W < 2"), TEMPLATE)
    assert r.kind == "invalid default" and "W < 2" in r.message and r.config.as_dict() == {"BM": 32, "W": 2}


def test_template_errors_name_the_line_and_config():
    r = reject(SPACE, "time: 1\n{% if BM > 16 %}\ntime: 2\n")
    assert r.kind == "template syntax error" and r.where == "template"
    r = reject(SPACE, "time: {{ ''.__class__ }}\n")
    assert r.kind == "forbidden template code" and r.line == 1
    # A branch that only one param value reaches is still rendered before anything compiles.
    r = reject(SPACE, "time: 1e-4\n{% if W == 4 %}\n{{ NO_SUCH_NAME }}\n{% endif %}\n")
    assert r.kind == "template does not render" and "NO_SUCH_NAME" in r.message
    assert r.config.as_dict()["W"] == 4


def test_c_candidates_are_checked_for_forbidden_code():
    space = SPACE.replace("language: script", "language: c")
    ok = ("#include <math.h>\n#include <omp.h>\nvoid tuner_kernel(const {{ ctype }} *x, {{ ctype }} *y) {\n"
          "  for (long i = 0; i < {{ M * N }}; i++) y[i] = expf(x[i]) * {{ BM * W }};\n}\n")
    check_candidate(space, ok, kit("cpu"), random.Random(0))
    r = reject(space, "#include <stdio.h>\n" + ok, kit("cpu"))
    assert r.kind == "forbidden code" and r.line == 1 and "stdio.h" in r.message and r.where == "rendered source"
    sneaky = ok.replace("}\n", "{% if BM == 64 %}  system(\"curl x\");\n{% endif %}}\n")
    r = reject(space, sneaky, kit("cpu"))
    assert r.kind == "forbidden code" and "'system'" in r.message and r.config.as_dict()["BM"] == 64
    assert 'system("curl x")' in r.text


def test_code_checks():
    assert check_c("#include <math.h>\n#pragma omp parallel for\nvoid f(float *y) { y[0] = sqrtf(2.f); }") == []
    bad = check_c('#include "evil.h"\nvoid f() { FILE *f = fopen("/etc/passwd", "r"); }\n'
                  '__attribute__((constructor)) void g(void) {}\n#define CAT(a, b) a##b\n'
                  'void h() { __asm__("nop"); }\n')
    assert [f.line for f in bad] == [1, 2, 3, 4, 5]
    # probes of the compiling machine's files (the answer would reach the compile error)
    probes = check_c('#if __has_include("/root/.ssh/id_rsa")\n#error yes\n#endif\n'
                     '#pragma GCC dependency "/etc/shadow"\nvoid f(float *y) { y[0] = 1.f; }\n')
    assert [f.line for f in probes] == [1, 4]
    # bytes of data placed in .text would run as code: no section attributes, nor a macro for one
    placed = check_c('__attribute__((section(".text"))) const unsigned char b[] = {0xc3};\n#define S __section__\n'
                     '#pragma clang section rodata=".text"\n')
    assert [f.line for f in placed] == [1, 2, 3]
    # names split across a backslash-newline are still found, on their first line
    assert [f.line for f in check_c('void f() { sys\\\ntem("x"); }')] == [1]
    assert check_python("import os\n") and check_python("import math\ndef launch(x, y):\n    pass\n") == []
    cheat = ("import torch\nimport triton\ndef launch(x, y):\n    y.copy_(torch.softmax(x, -1))\n")
    assert any("torch.softmax" in f.why for f in check_python(cheat))
    assert check_source("triton", cheat) and check_source("script", "anything") == []
    assert check_template("{{ x.y }} {% for i in range(3) %}{{ loop.index }}{% endfor %}") == []
    assert check_template("{{ x|attr('y') }}")


def test_repair_request_says_what_and_where():
    k = kit()
    r = reject(SPACE.replace("BM <= M", "BM <= Q"), TEMPLATE)
    msg = k.repair(r.kind, r.message, r.line, r.text, r.where, None, 1, 3)["content"]
    assert "rejected: invalid space" in msg and "Offending line 7 of the space" in msg and "BM <= Q" in msg
    assert "repair attempt 1 of 3" in msg and "```yaml" in msg


def test_prompts_carry_the_op_device_rules_and_an_example():
    k = kit("cpu")
    system, user = k.propose()
    assert system["role"] == "system" and "```yaml" in system["content"]
    text = user["content"]
    for needle in ("Operator: softmax", "x [64, 128] fp32", "y [64, 128] fp32", "M=64, N=128",
                   "void tuner_kernel(const float *x, float *y)", "THREADS <= CORES", "cpu device",
                   "copy_gbps = 100", "Worked example from the library: softmax/c", "ctype (= 'float')"):
        assert needle in text, needle


def test_a_simulated_npus_prompt_says_what_its_time_is_a_model_of():
    """The sim backend times a module's ASCEND_COST: a model that never heard of it writes
    skeletons the simulator cannot time, and one that did must know that it is checked."""
    text = kit("sim").propose()[1]["content"]
    for needle in ("ASCEND_COST", "`step_vector`: per step: fp32 vector element-operations",
                   "understated cost is refused", "Worked example from the library: softmax/triton_ascend"):
        assert needle in text, needle
    assert "ASCEND_COST" not in kit("cuda").propose()[1]["content"]


def test_integer_tensors_are_named_with_their_own_type_in_the_prompt():
    """cross_entropy's targets are int64: the prompt's entry and inputs said `const float *target`."""
    user = kit("cpu", "cross_entropy", "8x32").propose()[1]["content"]
    assert ("      #include <stdint.h>\n      void tuner_kernel(const float *logits, const int64_t *target, "
            "float *loss)") in user  # with the header the type needs, indented as the entry's block
    assert "target [8] int64" in user and "logits [8, 32] fp32" in user


def test_triton_candidates_go_through_the_triton_contract():
    k = kit("cuda")
    user = k.propose()[1]["content"]
    assert "def launch(x, y)" in user and "num_warps" in user
    space = SPACE.replace("language: script", "language: triton")
    kernel = ("import triton\nimport triton.language as tl\n\n@triton.jit\n"
              "def k(x_ptr, y_ptr, N: tl.constexpr, B: tl.constexpr):\n"
              "    i = tl.arange(0, B)\n    tl.store(y_ptr + i, tl.load(x_ptr + i), mask=i < N)\n\n"
              "def launch(x, y):\n    k[(x.numel() // {{ BM }},)](x, y, {{ N }}, B={{ BM }}, num_warps={{ W }})\n")
    check_candidate(space, kernel, k, random.Random(0))
    cheat = kernel.replace("    k[(x.numel()", "    y.copy_(torch.softmax(x, -1))\n    k[(x.numel()")
    r = reject(space, "import torch\n" + cheat, k)
    assert r.kind == "forbidden code" and ".copy_()" in r.message and "torch.softmax" in r.text
