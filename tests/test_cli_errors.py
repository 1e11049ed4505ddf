"""Bad input gets a clear error that says what to fix (exit code 2), and no traceback."""

import os
import stat
import sys

import pytest

from tests.conftest import FIXTURES
from tuner.cli import NO_WINNER
from tuner.cli.main import main
from tuner.core.values import Status
from tuner.run.store import Store


def run(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def test_unknown_op_lists_known(capsys):
    rc, err = run(capsys, "tune", "sofmax", "--shape", "4x4")
    assert rc == 2 and "unknown op 'sofmax'" in err and "softmax" in err and "rmsnorm" in err
    assert "did you mean 'softmax'?" in err
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--dtype", "bf61")
    assert rc == 2 and "did you mean 'bf16'?" in err
    rc, err = run(capsys, "tune", "zzzz", "--shape", "4x4")
    assert rc == 2 and "did you mean" not in err  # nothing close: no guess


@pytest.mark.parametrize("shape", ["4096", "4096x", "axb", "0x5", "1x2x3"])
def test_bad_shape(capsys, shape):
    rc, err = run(capsys, "tune", "softmax", "--shape", shape)
    assert rc == 2 and "bad shape" in err and "MxN" in err


def test_shape_too_large_to_verify(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_RUNS_DIR", str(tmp_path / "runs"))
    rc, err = run(capsys, "tune", "softmax", "--shape", "99999999999x99999999", "--budget", "1")
    assert rc == 2 and "too large to verify here" in err and "smaller shape" in err
    assert not any((tmp_path / "runs").glob("*/records.jsonl"))


def test_missing_shape(capsys):
    rc, err = run(capsys, "tune", "matmul")
    assert rc == 2 and "--shape is required" in err and "MxNxK" in err


def test_malformed_space_names_file_and_line(capsys, tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text("language: c\nparams:\n  A: [1, 2]\nconstraints:\n  - A < undefined_thing\n")
    tpl = tmp_path / "t.c.j2"
    tpl.write_text("void tuner_kernel(void) {}\n")
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--template", str(tpl), "--space", str(space),
                  "--runs-dir", str(tmp_path / "runs"))
    assert rc == 2 and f"{space}:5" in err and "undefined_thing" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_malformed_template_names_file_and_line(capsys, tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text("language: c\nparams:\n  A: [1, 2]\n")
    tpl = tmp_path / "t.c.j2"
    tpl.write_text("int x;\n{% if A %}\nvoid f(void) {}\n")
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--template", str(tpl), "--space", str(space))
    assert rc == 2 and f"{tpl}:" in err and "syntax" in err


def test_problem_file_that_fails_to_import(capsys):
    rc, err = run(capsys, "tune", "--op", str(FIXTURES / "kernelbench/broken.py"))
    assert rc == 2 and "failed to import" in err and "broken on purpose" in err


def test_problem_file_without_skeleton_says_what_to_provide(capsys):
    rc, err = run(capsys, "tune", "--op", str(FIXTURES / "kernelbench/linear.py"), "--backend", "cpu")
    assert rc == 2 and "--template FILE --space FILE" in err
    # the exact entry the template must define: input, then the Linear's weight and bias, then the output
    assert "void tuner_kernel(const {{ ctype }} *in0, const {{ ctype }} *fc_weight, " \
           "const {{ ctype }} *fc_bias, {{ ctype }} *out0)" in err
    assert "{{ batch }}" in err  # sizes are template variables, not names the C code knows


def test_problem_file_unknown_size_override(capsys):
    rc, err = run(capsys, "tune", "--op", str(FIXTURES / "kernelbench/relu.py"), "--size", "nope=3")
    assert rc == 2 and "nope" in err and "batch_size" in err


def test_no_c_compiler(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--backend", "cpu", "--runs-dir", str(tmp_path))
    assert rc == 2 and "C compiler" in err and "gcc" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_runs_dir(capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--backend", "null", "--template",
                  str(FIXTURES / "null/good.txt.j2"), "--space", str(FIXTURES / "null/good.yaml"),
                  "--runs-dir", str(ro / "runs"))
    assert rc == 2 and "cannot write" in err


def test_unwritable_runs_dir_as_file(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--backend", "null", "--template",
                  str(FIXTURES / "null/good.txt.j2"), "--space", str(FIXTURES / "null/good.yaml"),
                  "--runs-dir", str(blocker / "runs"))
    assert rc == 2 and "cannot write to the runs directory" in err


def test_not_a_run_directory(capsys, tmp_path):
    rc, err = run(capsys, "show", str(tmp_path))
    assert rc == 2 and "not a run directory" in err


def test_resume_refuses_flags_that_would_be_ignored(capsys, tmp_path):
    """A resume continues the run as it was created: a new shape, dtype, seed or skeleton would
    be silently ignored; refused, before the run is opened (nothing written)."""
    for extra, words in ((["--shape", "128x128"], "--shape would be ignored"),
                         (["softmax", "--dtype", "bf16", "--seed", "3"], "OP, --dtype, --seed would be ignored"),
                         (["--template", "t.c.j2", "--sampler", "tpe"], "--template, --sampler would be ignored")):
        rc, err = run(capsys, "tune", "--resume", str(tmp_path), *extra)
        assert rc == 2 and words in err and "start a new run without --resume" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, words", [
    (["tune", "softmax", "--shape", "8x8", "--stop-gain", "0.01"], "--stop-gain says when a --patience stall"),
    (["tune", "softmax", "--shape", "8x8", "--devices", "2"], "--devices is for --executor ray"),
    (["sweep", "s.yaml", "--ray-address", "127.0.0.1:1"], "--ray-address is for --executor ray"),
    (["sweep", "s.yaml", "--concurrency", "4"], "--concurrency is for --executor ray"),
    (["profile", "m.py", "--min-share", "0.05"], "--min-share picks the operators --emit writes"),
    (["show", "r", "--json", "--csv", "-"], "--json and --csv/--parquet are different views"),
    (["export", "r", "--db", "x.json"], "give a run (r) or --db (x.json), not both"),
    (["export", "r", "--backend", "cpu"], "--backend and --device pick entries of --db"),
])
def test_a_flag_that_would_do_nothing_is_refused(capsys, tmp_path, argv, words):
    rc, err = run(capsys, *argv, *(["--runs-dir", str(tmp_path)] if argv[0] == "tune" else []))
    assert rc == 2 and words in err and list(tmp_path.iterdir()) == []


def test_run_from_another_format_version(capsys, tmp_path):
    (tmp_path / "run.json").write_text('{"format_version": 0}')
    rc, err = run(capsys, "tune", "--resume", str(tmp_path))
    assert rc == 2 and "format version 0" in err


def test_unknown_dtype(capsys):
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--dtype", "fp8")
    assert rc == 2 and "unknown dtype" in err


def test_dtype_the_backend_cannot_run(capsys, tmp_path):
    rc, err = run(capsys, "tune", "softmax", "--shape", "4x4", "--dtype", "bf16", "--backend", "cpu",
                  "--runs-dir", str(tmp_path / "runs"))
    assert rc == 2 and "bf16" in err and "--dtype fp32" in err
    assert not (tmp_path / "runs").exists()


def test_problem_file_that_loops_at_import(capsys, tmp_path, monkeypatch):
    from tuner.core import problem
    monkeypatch.setattr(problem, "IMPORT_TIMEOUT_S", 1.0)
    f = tmp_path / "spin.py"
    f.write_text("import torch\nwhile True:\n    pass\n")
    rc, err = run(capsys, "tune", "--op", str(f), "--budget", "1")
    assert rc == 2 and "importing it took more than 1 s" in err


@pytest.mark.parametrize("body,says", [
    ("import os\nos._exit(0)\n", "ended the process (exit status 0)"),
    ("import ctypes\nctypes.string_at(0)\n", "killed by SIGSEGV"),
])
def test_problem_file_that_ends_or_crashes_the_process_at_import(capsys, tmp_path, body, says):
    # imported in a child process first: the tool itself lives to say what happened
    f = tmp_path / "hostile.py"
    f.write_text(body)
    rc, err = run(capsys, "tune", "--op", str(f), "--budget", "1")
    assert rc == 2 and str(f) in err and says in err
    assert not (tmp_path / "runs").exists()


def test_problem_whose_model_cannot_run_its_inputs(capsys, tmp_path):
    f = tmp_path / "noinputs.py"
    f.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                 "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n")
    rc, err = run(capsys, "tune", "--op", str(f), "--budget", "1")
    assert rc == 2 and "Model(...)(*get_inputs()) failed" in err and "missing 1 required positional" in err


def test_space_with_no_valid_config_at_this_shape(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_RUNS_DIR", str(tmp_path / "runs"))
    space = tmp_path / "s.yaml"
    space.write_text("language: c\nsizes: [M, N]\nparams:\n  A: [1, 2, 3]\nconstraints:\n  - A * M > 1000\n")
    tpl = tmp_path / "t.c.j2"
    tpl.write_text("void tuner_kernel(const {{ ctype }} *x, {{ ctype }} *y) {}\n")
    rc, err = run(capsys, "tune", "softmax", "--shape", "8x8", "--template", str(tpl), "--space", str(space),
                  "--budget", "2")
    assert rc == 2 and "none of the 3 configs satisfies" in err and "A * M > 1000" in err


def test_a_large_space_whose_shape_constraint_fails_is_refused_before_a_search(capsys, tmp_path, monkeypatch):
    """Too large to enumerate (24**4 configs), but its one constraint reads no param: it fails
    for every config at this shape, so the run is refused at once (a search would draw
    hundreds of invalid configs, minutes for nothing) and leaves no run directory."""
    monkeypatch.setenv("TUNER_RUNS_DIR", str(tmp_path / "runs"))
    space = tmp_path / "s.yaml"
    values = "[" + ", ".join(str(v) for v in range(24)) + "]"
    space.write_text(f"language: c\nsizes: [M, N]\nparams:\n  A: {values}\n  B: {values}\n  C: {values}\n"
                     f"  D: {values}\nconstraints:\n  - A + B < 90\n  - M <= 16\n")
    tpl = tmp_path / "t.c.j2"
    tpl.write_text("void tuner_kernel(const {{ ctype }} *x, {{ ctype }} *y) {}\n")
    rc, err = run(capsys, "tune", "softmax", "--shape", "64x8", "--template", str(tpl), "--space", str(space),
                  "--budget", "2")
    assert rc == 2 and "the constraint 'M <= 16' reads no param, and it fails at this shape" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_template_that_raises_or_runs_away_is_a_compile_error(tmp_path):
    from tuner.core.skeleton import Skeleton, SkeletonError, load_skeleton
    from tuner.core.values import Config
    space = tmp_path / "s.yaml"
    space.write_text("language: c\nparams:\n  A: [1, 2]\n")
    for text, says in [("a\\n{{ 1 // (A - A) }}\\n", ":2: ZeroDivisionError"),
                       ("{% for i in range(10**9) %}x{% endfor %}", "SecurityError: safe_range: an argument of 1000000000"),
                       ("{% for i in range(99999) %}{% for j in range(99999) %}xxxx{% endfor %}{% endfor %}",
                        "runs away"),
                       ('{{ "x" * 10**10 }}', "SecurityError: a sequence of 1 repeated"),  # 10 GB in one op
                       ("{{ 7 ** 100000 }}", "too large a number")]:
        tpl = tmp_path / "t.c.j2"
        tpl.write_text(text.replace("\\n", "\n"))
        sk: Skeleton = load_skeleton(tpl, space)
        with pytest.raises(SkeletonError, match=says):
            sk.render(Config.of({"A": 1}), {})


def test_template_loops_that_write_nothing_end_at_the_deadline(tmp_path, monkeypatch):
    """Nested loops with an empty body never reach the source-size check: such a template ran on
    without end in the tool's own process (an evaluation thread). Now its own code stops at
    RENDER_TIMEOUT_S, in a thread as well, and the config is a COMPILE_ERROR."""
    import threading
    import time

    from tuner.core import skeleton
    from tuner.core.values import Config
    monkeypatch.setattr(skeleton, "RENDER_TIMEOUT_S", 0.5)
    space = tmp_path / "s.yaml"
    space.write_text("language: c\nparams:\n  A: [1, 2]\n")
    tpl = tmp_path / "t.c.j2"
    tpl.write_text("{% set x = range(20000)|list %}\n{% for a in x %}{% for b in x %}{% endfor %}{% endfor %}\n")
    sk = skeleton.load_skeleton(tpl, space)
    said = []

    def render():
        started = time.monotonic()
        with pytest.raises(skeleton.SkeletonError, match=r"t.c.j2:2: rendering took more than 0.5 s") as e:
            sk.render(Config.of({"A": 1}), {})
        said.append((str(e.value), time.monotonic() - started))
    t = threading.Thread(target=render, daemon=True)
    t.start()
    t.join(30)
    assert said and said[0][1] < 5, said
    assert sys.gettrace() is None or "coverage" in repr(sys.gettrace())  # the trace is taken off again


def test_model_proposer_without_key_or_endpoint(capsys, tmp_path, monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TUNER_LLM_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TUNER_RUNS_DIR", str(tmp_path / "runs"))
    rc, err = run(capsys, "tune", "softmax", "--shape", "64x64", "--proposer", "openai", "--llm", "m")
    assert rc == 2 and "needs a key" in err and "--llm-base-url" in err


def test_problem_without_skeleton_shows_the_entry_signature_with_integer_inputs(capsys, tmp_path):
    f = tmp_path / "gather.py"
    f.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, idx, w):\n        return w[idx]\n"
                 "def get_inputs():\n    return [torch.randint(0, 100, (64,)), torch.randn(100, 32)]\n"
                 "def get_init_inputs():\n    return []\n")
    rc, err = run(capsys, "tune", "--op", str(f), "--backend", "cpu", "--budget", "1")
    assert rc == 2 and "void tuner_kernel(const int64_t *in0, const {{ ctype }} *in1, {{ ctype }} *out0)" in err
    # A kernel written to that entry passes: the output is a buffer of the run's dtype in the
    # check and the timing alike (the check gave it float64, the reference's, when the first
    # input was not floating).
    tpl, space = tmp_path / "g.c.j2", tmp_path / "g.yaml"
    tpl.write_text("#include <stdint.h>\n#include <string.h>\nvoid tuner_kernel(const int64_t *in0, "
                   "const {{ ctype }} *in1, {{ ctype }} *out0) {\n  for (long i = 0; i < 64; i++)\n"
                   "    memcpy(out0 + i * 32, in1 + in0[i] * 32, 32 * sizeof({{ ctype }}));\n}\n")
    space.write_text("language: c\nparams:\n  V: [1]\n")
    rc, _ = run(capsys, "tune", "--op", str(f), "--backend", "cpu", "--budget", "1", "--template", str(tpl),
                "--space", str(space), "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert rc == 0
    (record,) = Store.open(next((tmp_path / "runs").iterdir())).records()
    assert record.status is Status.OK, record.reason


def test_problem_whose_inputs_are_not_all_tensors(capsys, tmp_path):
    path = tmp_path / "intarg.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x, k):\n        return x * k\n\n\n"
                    "def get_inputs():\n    return [torch.randn(64), 3]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    rc, err = run(capsys, "tune", "--op", str(path), "--backend", "cpu", "--budget", "1",
                  "--runs-dir", str(tmp_path / "runs"))
    assert rc == 2 and "value of type int at position 1" in err and "get_init_inputs()" in err


def test_text_with_brackets_is_shown_as_it_is(capsys, tmp_path, monkeypatch):
    """rich read brackets in the summary as markup: a compiler message with '[/]' crashed the
    report after the whole search (MarkupError), and a problem file's sizes '[batch=8 ...]'
    vanished from the title as if they were a style."""
    monkeypatch.setenv("TUNER_RUNS_DIR", str(tmp_path / "runs"))
    tpl = tmp_path / "t.c.j2"
    tpl.write_text("#error closing tag [/] and [bold]markup[/bold]\n")
    rc = main(["tune", "--op", str(FIXTURES / "kernelbench/linear.py"), "--template", str(tpl),
               "--space", str(FIXTURES / "kernelbench/linear.yaml"), "--budget", "1"])
    out, err = capsys.readouterr()
    assert rc == NO_WINNER and "Traceback" not in err, err
    assert "linear [batch=8 in_features=64 out_features=32] fp32" in out
    assert "closing tag [/] and [bold]markup[/bold]" in out


def test_a_database_in_a_read_only_place_says_which_file(capsys, tmp_path, monkeypatch):
    """As root nothing is read-only to the process, so the refusal is the filesystem's, raised
    where the database is written."""
    import errno

    from tuner.serve import db
    target = tmp_path / "ro" / "tuning-db.json"

    def refuse(self):
        raise PermissionError(errno.EACCES, "Permission denied", str(target))
    monkeypatch.setattr(db.TuningDB, "save", refuse)
    rc, err = run(capsys, "db", "update", str(tmp_path), "--db", str(target))
    assert rc == 2 and f"cannot write {target}: Permission denied" in err and "--db" in err
