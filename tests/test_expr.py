import pickle

import pytest

from tuner.core.expr import ExprError, parse


def test_arithmetic_and_logic():
    e = parse("BM * BK * (STAGES + 1) <= 4096 and not SPLIT or cdiv(M, BM) > 2")
    assert e.names == {"BM", "BK", "STAGES", "SPLIT", "M"}
    assert e({"BM": 16, "BK": 16, "STAGES": 1, "SPLIT": False, "M": 1})
    assert not e({"BM": 64, "BK": 64, "STAGES": 1, "SPLIT": False, "M": 64})
    assert parse("1 < X <= 3")({"X": 3}) and not parse("1 < X <= 3")({"X": 4})
    assert parse("A if B else C")({"A": 1, "B": False, "C": 2}) == 2
    assert parse("S in ['static', 'dynamic']")({"S": "static"})
    assert parse("max(a, b) // 2")({"a": 7, "b": 3}) == 3
    assert pickle.loads(pickle.dumps(e)).text == e.text


@pytest.mark.parametrize("text", [
    "__import__('os').system('echo hi')",
    "open('/etc/passwd')",
    "x.__class__",
    "[c for c in ()]",
    "lambda: 1",
    "eval('1')",
    "a[0]",
    "f'{x}'",
    "x := 1",
    "",
    "1 +",
])
def test_rejects_unsafe_or_malformed(text):
    with pytest.raises(ExprError):
        parse(text)


def test_runtime_errors_are_expr_errors():
    with pytest.raises(ExprError, match="division by zero"):
        parse("M // BM")({"M": 4, "BM": 0})
    with pytest.raises(ExprError, match="unknown name"):
        parse("Q + 1")({})
    with pytest.raises(ExprError, match="exponent"):
        parse("2 ** X")({"X": 10**9})
