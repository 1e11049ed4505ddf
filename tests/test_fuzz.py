"""Property-based fuzzing of what a model writes and the tool parses in its own process: the
expression evaluator, the space parser, the template renderer and the reply extractor. Each
must answer within its bound with a value or its own error type, whatever the input."""

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.core.expr import ExprError, parse
from tuner.core.skeleton import Skeleton, SkeletonError
from tuner.core.space import Space, SpaceError, parse_space
from tuner.core.values import Config
from tuner.llm.proposer import Rejection, extract

FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))

_EXPR_TOKENS = ["BM", "BN", "K", "1", "2", "64", "10**9", "2**64", "0", "0.5", "'x'", "'%9999999d'", "+", "-",
                "*", "/", "//", "%", "**", "(", ")", "<=", "==", "in", "not", "and", "or", "if", "else",
                "min(", "max(", "cdiv(", "log2(", "int(", "round_up(", ",", "[", "]", "1e308", "-1"]


@FUZZ
@given(st.lists(st.sampled_from(_EXPR_TOKENS), min_size=1, max_size=40))
def test_expressions_answer_a_value_or_an_expr_error(tokens):
    text = " ".join(tokens)
    t0 = time.monotonic()
    try:
        e = parse(text)
        e({"BM": 64, "BN": 32, "K": 7})
        e.violation({"BM": 64, "BN": 32, "K": 7})
    except ExprError:
        pass
    assert time.monotonic() - t0 < 1.0, text


_YAML_PIECES = ["params:\n", "  BM: [32, 64]\n", "  BN: {range: [1, 8]}\n", "constraints:\n", "  - BM * BN <= 4096\n",
                "  - 2 ** 64 ** 64 > 1\n", "resources:\n", "  smem: BM * 4\n", "x: &a [1, 2]\n", "  V: *a\n",
                "  T: !foo 1\n", "description: 2024-01-01\n", "description: !!binary aGk=\n", "default:\n",
                "  BM: 32\n", "promising:\n", "  - {BM: 64}\n", "language: c\n", "sizes: [M, N]\n", "- ", ": ", "{", "]"]


@FUZZ
@given(st.lists(st.sampled_from(_YAML_PIECES), min_size=1, max_size=14))
def test_spaces_parse_or_say_why(pieces):
    text = "".join(pieces)
    t0 = time.monotonic()
    try:
        parse_space(text, "fuzz.yaml")
    except SpaceError:
        pass
    assert time.monotonic() - t0 < 2.0, text


_TEMPLATE_PIECES = ["{{ V }}", "{{ V * 10**9 }}", '{{ "x" * V }}', '{{ "x"|center(V * 10**8) }}', "{% for i in range(V) %}",
                    "{% endfor %}", "{% if V %}", "{% endif %}", '{{ "%d" % V }}', '{{ "{:>9999999}".format(1) }}',
                    "{{ 1 // 0 }}", "{{ undefined_name }}", "{% set n = namespace(v=3) %}", "{{ n.v * n.v }}",
                    '{{ "ab".replace("a", "aa") }}', "{{ ''.__class__ }}", "{{ V|indent(10**7) }}", "{%", "}}", "text\n"]
_SPACE = Space.from_json({"params": {"V": {"values": [3]}}})


@FUZZ
@given(st.lists(st.sampled_from(_TEMPLATE_PIECES), min_size=1, max_size=12))
def test_templates_render_or_say_why(pieces):
    text = "".join(pieces)
    t0 = time.monotonic()
    try:
        Skeleton(text, _SPACE, "c").render(Config.of({"V": 3}), {})
    except SkeletonError:
        pass
    assert time.monotonic() - t0 < 6.0, text  # the render deadline is 5 s


_REPLY_PIECES = ["<think>", "</think>", "```", "```yaml\n", "```jinja\n", "params:\n  V: [1]\n", "{{ V }}\n", "\n",
                 "text ", "```c\n", "`", "<think>```yaml\n"]


@FUZZ
@given(st.lists(st.sampled_from(_REPLY_PIECES), min_size=0, max_size=60), st.sampled_from(["stop", "length"]))
def test_replies_give_a_space_and_template_or_a_rejection(pieces, finish):
    reply = "".join(pieces)
    try:
        space, template = extract(reply, finish)
        assert isinstance(space, str) and isinstance(template, str)
    except Rejection:
        pass
