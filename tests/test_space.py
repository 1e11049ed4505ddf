import pytest

from tuner.core.space import SpaceError, parse_space
from tuner.core.values import Config

GOOD = """\
language: c
sizes: [M, N]
params:
  BLOCK: {pow2: [16, 256]}
  ROWS: [1, 2, 4]
  THREADS: {range: [1, 8], step: 1}
  ONLINE: bool
  SCHED: [static, dynamic]
constraints:
  - ONLINE or BLOCK >= N
  - THREADS <= CORES
resources:
  scratch_bytes: BLOCK * ROWS * DTYPE_BYTES
default: {BLOCK: 64, ROWS: 2, THREADS: 1, ONLINE: true, SCHED: static}
"""


def test_parses_all_param_kinds():
    s = parse_space(GOOD, "good.yaml")
    assert s.param("BLOCK").values == (16, 32, 64, 128, 256) and s.param("BLOCK").log
    assert s.param("THREADS").values == tuple(range(1, 9))
    assert s.param("ONLINE").values == (False, True) and not s.param("ONLINE").ordered
    assert s.size == 5 * 3 * 8 * 2 * 2
    assert s.default_config()["BLOCK"] == 64
    assert len(list(s.configs())) == s.size


def test_check_constraints_and_resources():
    s = parse_space(GOOD, "good.yaml")
    ctx = {"M": 8, "N": 100, "DTYPE_BYTES": 4, "CORES": 2}
    ok = Config.of({"BLOCK": 64, "ROWS": 2, "THREADS": 1, "ONLINE": True, "SCHED": "static"})
    assert s.check(ok, ctx) is None
    assert "ONLINE or BLOCK >= N" in s.check(Config.of({**ok.as_dict(), "ONLINE": False}), ctx)
    assert "THREADS <= CORES" in s.check(Config.of({**ok.as_dict(), "THREADS": 4}), ctx)
    assert "exceeds the device limit" in s.check(ok, ctx, {"scratch_bytes": 100})
    assert "not a point" in s.check(Config.of({"BLOCK": 3}), ctx)
    with pytest.raises(SpaceError, match="no size"):
        s.check(ok, {"M": 8, "DTYPE_BYTES": 4, "CORES": 2})


def test_json_roundtrip():
    s = parse_space(GOOD, "good.yaml")
    from tuner.core.space import Space
    back = Space.from_json(s.to_json())
    assert back.to_json() == s.to_json()


@pytest.mark.parametrize("text, line, message", [
    ("params: {}\n", 1, "non-empty"),
    ("sizes: [M]\n", 1, "no 'params'"),
    ("params:\n  A: []\n", 2, "no values"),
    ("params:\n  A: [1, 2]\nconstraints:\n  - A <= Q\n", 4, "unknown name(s) ['Q']"),
    ("params:\n  A: [1, 2]\nconstraints:\n  - A <=\n", 4, "syntax error"),
    ("params:\n  A: [1, 2]\nconstraints:\n  - open('x')\n", 4, "not allowed"),
    ("params:\n  A: {pow2: [3, 64]}\n", 2, "powers of two"),
    ("params:\n  A: {range: [9, 1]}\n", 2, "empty range"),
    ("params:\n  A: {range: [0, 1000000]}\n", 2, "at most"),
    ("params:\n  A: [1, 1]\n", 2, "twice"),
    ("params:\n  1A: [1]\n", 2, "identifier"),
    ("params:\n  A: [1]\nbogus: 1\n", 3, "unknown key"),
    ("params:\n  A: [1, 2]\ndefault: {A: 3}\n", 3, "not one of"),
    ("params:\n  A: [1, 2]\npromising: {A: 2}\n", 3, "must be a list of configs"),
    ("params:\n  OFF: [1, 2]\ndefault: {OFF: 2}\n", 3, "quote the param's name"),
    ("params:\n  A: [1, 2]\npromising:\n  - {A: 2}\n  - {A: 3}\n", 5, "promising config 2 A=3 is not one of"),
    ("params:\n  A: [1, 2]\npromising:\n  - {B: 2}\n", 4, "unknown param 'B'"),
    ("params:\n  A: [1, 2]\npromising:\n  - 2\n", 4, "must be a mapping"),
    ("params:\n  A: [1, 2]\npromising:\n" + "  - {A: 1}\n" * 33, 3, "at most 32"),
    ("params:\n  A: [1, [2]]\n", 2, "must be a number"),
    ("sizes: [N]\nparams:\n  N: [1, 2]\n", 3, "param 'N' has the name of a size"),
    ("params:\n  CORES: [1, 2]\n", 2, "what the backend gives"),
    ("params:\n  A: {weird: 1}\n", 2, "expected a list"),
    ("params: [\n", 2, "not valid YAML"),
    ("- 1\n- 2\n", None, "mapping"),
])
def test_rejects_malformed_with_file_and_line(text, line, message):
    with pytest.raises(SpaceError) as e:
        parse_space(text, "bad.yaml")
    assert message in str(e.value)
    assert str(e.value).startswith("bad.yaml")
    if line is not None:
        assert str(e.value).startswith(f"bad.yaml:{line}:"), str(e.value)


def test_a_param_named_as_a_size_of_the_op_is_refused():
    """A param N hid the op's size N from the template and the formulas: every config of a
    C kernel looped to the param's value and left the output unwritten (WRONG_RESULT)."""
    s = parse_space("params:\n  N: [1, 2]\n  ctype: [float]\n", "x.yaml")
    with pytest.raises(SpaceError, match=r"param\(s\) \['N', 'ctype'\] have the name of"):
        s.check(Config.of({"N": 1, "ctype": "float"}), {"M": 8, "N": 64, "ctype": "double", "DTYPE_BYTES": 8})


def test_huge_space_rejected():
    text = "params:\n" + "".join(f"  P{i}: {{range: [0, 99]}}\n" for i in range(8))
    with pytest.raises(SpaceError, match="points"):
        parse_space(text, "huge.yaml")


def test_unsatisfiable_constraint_is_reported_per_config():
    s = parse_space("params:\n  A: [1, 2]\nconstraints:\n  - A > 5\n", "x.yaml")
    assert all(s.check(c, {"DTYPE_BYTES": 4, "CORES": 1}) for c in s.configs())


def test_a_constraint_on_the_shape_alone_is_found_failing_without_a_config():
    """What refuses a space no config can satisfy at a shape before it is enumerated (or,
    past the enumeration limit, searched to no end): only constraints that read no param
    and no resource count, and one that cannot be evaluated is left to the per-config check."""
    s = parse_space("sizes: [M, N]\nparams:\n  B: [1, 2]\nresources:\n  r: B * M\nconstraints:\n"
                    "  - B <= 2\n  - r < 10\n  - N // (M - 16) >= 0\n  - M <= 16\n", "x.yaml")
    ctx = {"DTYPE_BYTES": 4, "CORES": 1, "N": 8}
    # r < 10 fails for every B, and N // 0 cannot be evaluated: neither counts
    assert s.failed_shape_constraint({**ctx, "M": 16}) is None
    assert s.failed_shape_constraint({**ctx, "M": 17}) == "M <= 16"


def test_bools_and_ints_are_distinct_points():
    s = parse_space("params:\n  FLAG: bool\n  N: [0, 1]\n", "x.yaml")
    ctx = {"DTYPE_BYTES": 4, "CORES": 1}
    assert s.check(Config.of({"FLAG": True, "N": 1}), ctx) is None
    assert "not a point" in s.check(Config.of({"FLAG": 1, "N": 1}), ctx)
    assert "not a point" in s.check(Config.of({"FLAG": True, "N": True}), ctx)


def test_violation_measures_how_far_a_config_is_from_valid():
    from tuner.core.expr import parse
    e = parse("BM * BK * STAGES * 2 <= 1000 and W in (4, 8)")
    assert e.violation({"BM": 10, "BK": 10, "STAGES": 2, "W": 4}) == 0.0
    small = e.violation({"BM": 10, "BK": 10, "STAGES": 6, "W": 4})
    large = e.violation({"BM": 40, "BK": 10, "STAGES": 6, "W": 4})
    assert 0 < small < large
    assert e.violation({"BM": 10, "BK": 10, "STAGES": 2, "W": 2}) >= 1.0
    assert parse("A < 2 or B < 2").violation({"A": 3, "B": 100}) < parse("B < 2").violation({"B": 100})


def test_repair_walks_an_invalid_default_to_a_valid_config_nearby():
    params = "".join(f"  {n}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" for n in "ABCDEFGHIJKL")
    space = parse_space("language: c\nparams:\n" + params + "constraints:\n"
                        "  - A + B + C + D + E + F + G + H + I + J + K + L < 20\n")
    default = space.default_config()
    assert space.check(default, {}) is not None  # 12 x 5 = 60: the valid configs are 5e-8 of the space
    fixed = space.repair(default, {})
    assert fixed is not None and space.check(fixed, {}) is None
    assert sum(fixed.as_dict().values()) == 19  # the least change that satisfies it
    impossible = parse_space("language: c\nparams:\n  A: [1, 2]\nconstraints:\n  - A > 5\n")
    assert impossible.repair(impossible.default_config(), {}) is None


def test_repair_can_keep_params_as_they_are():
    """The guided search completes a rejected one-step move: the moved param keeps its new
    value and the others change as little as makes the config valid."""
    space = parse_space("language: c\nsizes: [N]\nparams:\n  LOOPED: [false, true]\n"
                        "  BLOCK: {pow2: [64, 4096]}\n  W: [1, 2, 4]\n"
                        "constraints:\n  - LOOPED or BLOCK >= N\n  - not LOOPED or BLOCK < N\n")
    moved = Config.of({"LOOPED": False, "BLOCK": 256, "W": 2})  # was LOOPED true, BLOCK 256
    assert space.check(moved, {"N": 1024}) is not None
    assert space.repair(moved, {"N": 1024}, keep=("LOOPED",)).as_dict() == {"LOOPED": False, "BLOCK": 1024, "W": 2}
    assert space.repair(moved, {"N": 1024}).as_dict()["LOOPED"] is True  # the move undone
    assert space.repair(moved, {"N": 1024}, keep=("LOOPED", "BLOCK")) is None


def test_a_default_rejected_at_the_shape_starts_the_search_at_each_single_change_that_repairs_it():
    """A one-pass default whose block is short of this row is repaired as well by the looped
    kernel at that block as by one pass with a block as long as the row; the two were 1.4x
    apart either way on recorded rmsnorm and layernorm landscapes, and a search that began at
    only the first (the smaller change) missed the other regime on a device. Every single
    change that repairs it is a start, the smallest changes first, up to MAX_STARTS."""
    from tuner.core.space import MAX_STARTS
    space = parse_space("language: c\nsizes: [N]\nparams:\n  LOOPED: [false, true]\n"
                        "  BLOCK: {pow2: [64, 4096]}\n  W: [1, 2, 4]\n"
                        "constraints:\n  - LOOPED or BLOCK >= N\n  - not LOOPED or BLOCK < N\n"
                        "default:\n  LOOPED: false\n  BLOCK: 256\n  W: 2\n")
    starts = space.starts({"N": 1024})
    assert [c.as_dict() for c in starts] == [{"LOOPED": False, "BLOCK": 256, "W": 2},  # the default, as written
                                             {"LOOPED": True, "BLOCK": 256, "W": 2},
                                             {"LOOPED": False, "BLOCK": 1024, "W": 2}]  # the nearest long enough block
    assert space.starts({"N": 128}) == [space.default_config()]  # valid here: no other start
    many = parse_space("language: c\nparams:\n" + "".join(f"  {n}: [0, 1]\n" for n in "ABCDEF")
                       + "constraints:\n  - A + B + C + D + E + F <= 5\n"
                       "default: {A: 1, B: 1, C: 1, D: 1, E: 1, F: 1}\n")
    assert len(many.starts({})) == 1 + MAX_STARTS
    coupled = parse_space("params:\n  A: [1, 2, 4, 8]\n  B: [1, 2, 4, 8]\n  C: [1, 2]\n"
                          "constraints:\n  - A == B\n  - A >= 4 or C == 9\n"
                          "default: {A: 1, B: 1, C: 1}\n")
    assert coupled.starts({})[1:] == [coupled.repair(coupled.default_config(), {})]  # no single change: `repair`


def test_promising_configs_are_completed_repaired_at_this_shape_and_kept_in_the_json():
    """The author's guesses: partial configs take the default's other values; one the formulas
    reject at this shape becomes the nearest config they accept; repeats are tried once."""
    s = parse_space(GOOD + "promising:\n  - {BLOCK: 256}\n  - {BLOCK: 16, ONLINE: false}\n"
                           "  - {BLOCK: 256, ROWS: 2}\n", "good.yaml")
    ctx = {"M": 8, "N": 100, "DTYPE_BYTES": 4, "CORES": 2}
    notes: list[str] = []
    promising = s.promising_configs(ctx, notes=notes)
    assert notes == [f"promising config 2 (BLOCK=16 ONLINE=False) is rejected at this shape (constraint "
                     f"failed: ONLINE or BLOCK >= N): trying the nearest valid config, {promising[1]}"]
    assert promising[0] == Config.of({**s.default_config().as_dict(), "BLOCK": 256})
    # BLOCK 16 not online breaks `ONLINE or BLOCK >= N`: repaired by one param, the smallest move
    assert len(promising) == 2 and s.check(promising[1], ctx) is None
    assert promising[1] != Config.of({**s.default_config().as_dict(), "BLOCK": 16, "ONLINE": False})
    from tuner.core.space import Space
    assert Space.from_json(s.to_json()).promising_configs(ctx) == promising
    assert parse_space(GOOD).promising_configs(ctx) == []


def test_repair_makes_two_coupled_moves_when_no_single_move_helps():
    """A one-pass kernel needs its block as long as the row and, for the registers that takes,
    fewer rows per program: neither change alone brings the config closer to valid, and a
    one-param-at-a-time repair gave up (the guided search's completion of a switch flip, and a
    default the formulas reject, then had nowhere to go)."""
    from tuner.core.values import Config
    sp = parse_space("params:\n  A: [1, 2, 4, 8]\n  B: [1, 2, 4, 8]\n  C: [1, 2]\n"
                     "constraints:\n  - A == B\n  - A >= 4 or C == 9\n")
    start = Config.of({"A": 1, "B": 1, "C": 1})
    assert all(sp.violation(Config.of({**start.as_dict(), "A": a}), {}) >= sp.violation(start, {}) for a in (2, 4, 8))
    assert sp.repair(start, {}) == Config.of({"A": 4, "B": 4, "C": 1})
    assert sp.repair(start, {}, keep=("B",)) is None  # B held at 1: A == B and A >= 4 cannot both hold
