"""Feedback from records: best-k with roofline %, failures by signature, edges, importance."""

import json

from tuner.core.space import parse_space
from tuner.core.values import Build, Config, Measurement, Record, Status
from tuner.llm.feedback import Feedback, build_feedback, render, signature

SPACE = parse_space("""
sizes: [M, N]
params:
  BM: {pow2: [16, 256]}
  W: [1, 2, 4, 8]
  ONLINE: bool
resources:
  smem_bytes: BM * 1024
""")


def rec(cfg, status=Status.OK, seconds=1e-3, error="", detail=""):
    build_status = status if status in (Status.INVALID, Status.COMPILE_ERROR, Status.COMPILE_TIMEOUT) else Status.OK
    build = Build(build_status, error=error)
    meas = Measurement(status, (seconds,) * 5 if status is Status.OK else (), detail=detail)
    return Record("op", "h", Config.of(cfg), build, meas, "dev")


def landscape():
    out = []
    for bm in (16, 32, 64, 128, 256):
        for w in (1, 2, 4, 8):
            out.append(rec({"BM": bm, "W": w, "ONLINE": False}, seconds=1e-3 * (300 / bm) * (1 + 0.01 * w)))
    out.append(rec({"BM": 256, "W": 8, "ONLINE": True}, Status.COMPILE_ERROR,
                   error="/tmp/run/build/ab12cd34ef56ab78/kernel.c:12:5: error: 'acc' undeclared\n  acc += 1;"))
    out.append(rec({"BM": 128, "W": 8, "ONLINE": True}, Status.COMPILE_ERROR,
                   error="/tmp/run/build/ffffeeeeddddcccc/kernel.c:40:9: error: 'acc' undeclared\n  acc += 2;"))
    out.append(rec({"BM": 64, "W": 4, "ONLINE": True}, Status.WRONG_RESULT, detail="max abs err 0.5 > tol"))
    for bm in (256, 128):
        out.append(rec({"BM": bm, "W": 1, "ONLINE": True}, Status.INVALID,
                       error=f"resource smem_bytes = {bm * 1024} exceeds the device limit 49152"))
    out.append(rec({"BM": 16, "W": 2, "ONLINE": True}, Status.COMPILE_ERROR,
                   error="ub overflow, requires 3145728 bits while 1572864 bits available"))
    return out


def test_feedback_contents():
    fb = build_feedback(landscape(), SPACE, flops=None, nbytes=1e6, peaks={"copy_gbps": 10.0},
                        reference_s=2e-3, round=2, skeleton_hash="abc", k=3)
    assert [b["config"]["BM"] for b in fb.best] == [256, 256, 256]
    assert [b["config"]["W"] for b in fb.best] == [1, 2, 4]
    first = fb.best[0]
    assert abs(first["percent"] - 100 * (1e6 / first["median_s"] / 1e9) / 10.0) < 0.01
    assert first["speedup"] > 1
    # Two compile errors on different lines and paths are one failure kind.
    ce = [f for f in fb.failures if f["status"] == "COMPILE_ERROR" and "undeclared" in f["signature"]]
    assert len(ce) == 1 and ce[0]["count"] == 2 and "kernel.c:N:N: error: 'acc' undeclared" == ce[0]["signature"]
    assert ce[0]["config"] == {"BM": 256, "W": 8, "ONLINE": True} and "acc += 1" in ce[0]["excerpt"]
    ub = next(f for f in fb.failures if "ub overflow" in f["signature"])
    assert ub["required"] == [3145728, 3145728] and ub["available"] == 1572864
    inv = next(f for f in fb.failures if f["status"] == "INVALID")
    assert inv["count"] == 2 and inv["required"] == [131072, 262144] and inv["available"] == 49152
    assert fb.invalid == 2 and fb.evaluated == 24 and abs(fb.invalid_share - 2 / 26) < 1e-9
    assert {"param": "BM", "value": 256, "side": "high", "low": 16, "high": 256} in fb.edges
    # W=1 is its low edge, but a count goes no lower: no hint to widen it; ONLINE is not ordered.
    assert {e["param"] for e in fb.edges} == {"BM"}
    # Where the constraints force BM=256 (one step in is invalid), widening is no hint either.
    forced = build_feedback(landscape(), SPACE, nbytes=1e6, k=3,
                            check=lambda c: "constraint failed: BM >= N" if c["BM"] < 256 else None)
    assert forced.edges == ()
    imp = dict(fb.importance)
    assert set(imp) == {"BM", "W"} and imp["BM"] > imp["W"]  # ONLINE never varied among passing configs

    text = render(fb)
    for needle in ("Round 2 (skeleton abc)", "24 configs compiled", "8% of 26 sampled",
                   "Best configs", "% of copy bandwidth", "COMPILE_ERROR x2: kernel.c:N:N: error: 'acc' undeclared",
                   "UB bits: required 3145728, available 1572864", "smem_bytes over the limit: required 131072 to 262144",
                   "WRONG_RESULT x1", "BM=256 is the largest value of [16 .. 256]", "Parameter importance", "BM "):
        assert needle in text, needle

    again = Feedback.from_json(json.loads(json.dumps(fb.to_json())))
    assert again == fb


def test_few_passing_configs_skip_importance_and_say_so():
    fb = build_feedback(landscape()[:3], SPACE)
    assert fb.importance == () and "importance not computed" in fb.notes[0]
    assert "No config passed" in render(build_feedback([rec({"BM": 16, "W": 1, "ONLINE": False}, Status.RUNTIME_ERROR,
                                                             detail="kernel crashed: worker died with SIGSEGV")], SPACE))


def test_later_record_of_a_config_supersedes():
    cfg = {"BM": 64, "W": 1, "ONLINE": False}
    fb = build_feedback([rec(cfg, seconds=1e-6), rec(cfg, Status.WRONG_RESULT, detail="winner re-check: off")], SPACE)
    assert fb.best == () and fb.failures[0]["status"] == "WRONG_RESULT"


def test_signature_blanks_incidentals():
    assert signature("x.c:1:2: error: foo 12 at /a/b/c.c") == signature("x.c:9:7: error: foo 13 at /d/c.c")
    assert signature("note: x\nkernel.c:3:1: error: bar") == "kernel.c:N:N: error: bar"


def test_retimed_figures_rank_first_and_are_the_ones_shown():
    """The search's fastest alone (BM=256 W=1) lost the side-by-side re-timing to W=2: the
    feedback ranks and shows the re-timed times, agreeing with the run's winner."""
    retimed = [{"config": {"BM": 256, "W": 2, "ONLINE": False}, "median_s": 1.1e-3},
               {"config": {"BM": 256, "W": 1, "ONLINE": False}, "median_s": 1.3e-3}]
    fb = build_feedback(landscape(), SPACE, reference_s=2e-3, k=3, retimed=retimed)
    assert [(b["config"]["W"], b["median_s"], b["timing"]) for b in fb.best] == [
        (2, 1.1e-3, "re-timed side by side"), (1, 1.3e-3, "re-timed side by side"),
        (4, fb.best[2]["median_s"], "search")]
    assert fb.best[0]["speedup"] == round(2e-3 / 1.1e-3, 3)
    text = render(fb)
    assert "1.1 ms*" in text and "1.3 ms*" in text


def test_a_structural_choice_shows_its_effect_even_where_importance_misses_it():
    # ONLINE doubles the time of every config; W and noise dominate the spread otherwise.
    recs = [rec({"BM": bm, "W": w, "ONLINE": on}, seconds=1e-3 * (2 if on else 1) * (1 + 3 * (w - 1) + 0.1 * (bm % 7)))
            for bm in (16, 32, 64) for w in (1, 2, 4, 8) for on in (False, True)]
    fb = build_feedback(recs, SPACE)
    effects = {e["param"]: e for e in fb.effects}
    assert effects["ONLINE"]["ratio"] == 2.0 and effects["ONLINE"]["fastest"] is False
    assert effects["W"]["ratio"] > 20 and fb.effects[0]["param"] == "W"
    assert "ONLINE: 2.00x (fastest with False, slowest with True" in render(fb)
    assert Feedback.from_json(json.loads(json.dumps(fb.to_json()))) == fb


def test_the_compilers_vectoriser_report_names_the_template_lines(tmp_path):
    import shutil

    import pytest

    from tuner.backends.cpu import CpuBackend, compiler
    from tuner.core.skeleton import Skeleton
    from tuner.llm.feedback import _compiler_notes
    if compiler() is None or "gcc" not in (shutil.which("gcc") or ""):
        pytest.skip("needs gcc")
    template = """#include <math.h>
void tuner_kernel(const {{ ctype }} *x, {{ ctype }} *y) {
  for (long r = 0; r < {{ rows }}; r++) {
    {{ ctype }} m = -INFINITY;
    for (long j = 0; j < {{ dim }}; j++) m = x[r * {{ dim }} + j] > m ? x[r * {{ dim }} + j] : m;
    for (long j = 0; j < {{ dim }}; j++) y[r * {{ dim }} + j] = expf(x[r * {{ dim }} + j] - m);
  }
}
"""
    sk = Skeleton(template, parse_space("params:\n  U: [1]\n"), "c")
    notes = _compiler_notes(CpuBackend(), sk, Config.of({"U": 1}), {"ctype": "float", "rows": 64, "dim": 1024},
                            tmp_path)
    assert notes and any(n.startswith("template line 3 `for (long r = 0; r < 64; r++) {`") for n in notes), notes
    assert all(n.startswith(("template line", "rendered line")) for n in notes)
