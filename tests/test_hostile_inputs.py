"""Broken and hostile inputs found by an audit: each gets an error that says what to fix (exit
code 2, no traceback) or is recorded as data, and none leaves a damaged or empty run behind."""

import json
from types import SimpleNamespace

import pytest

from tests.conftest import FIXTURES
from tuner.cli.main import main
from tuner.core.ops import builtin_spec
from tuner.core.space import SpaceError, parse_space
from tuner.core.values import Config
from tuner.run.store import Store, StoreError

NULL = ["--backend", "null", "--template", str(FIXTURES / "null/good.txt.j2"),
        "--space", str(FIXTURES / "null/good.yaml")]


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def problem(tmp_path, forward: str, inputs: str = "[torch.randn(batch_size, 8)]", size: int = 4):
    f = tmp_path / "p.py"
    f.write_text(f"import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        {forward}\n"
                 f"batch_size = {size}\ndef get_inputs():\n    return {inputs}\n"
                 f"def get_init_inputs():\n    return []\n")
    return f


@pytest.mark.parametrize("forward", ["return 3.0", "pass", "return {'y': x}"])
def test_problem_whose_forward_returns_no_tensor(capsys, tmp_path, forward):
    rc, err = run(capsys, "tune", "--op", problem(tmp_path, forward), *NULL, "--runs-dir", tmp_path / "runs")
    assert rc == 2 and "Model.forward returned a" in err and "must return a tensor" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("inputs", ["torch.randn(batch_size, 8)", "(torch.randn(4) for _ in range(1))"])
def test_problem_whose_get_inputs_is_not_a_list(capsys, tmp_path, inputs):
    rc, err = run(capsys, "tune", "--op", problem(tmp_path, "return x * 2", inputs), *NULL)
    assert rc == 2 and "get_inputs() returned a" in err and "list of tensors" in err


def test_problem_with_an_empty_input(capsys, tmp_path):
    rc, err = run(capsys, "tune", "--op", problem(tmp_path, "return x * 2", size=0), *NULL)
    assert rc == 2 and "input 0 has no elements" in err and "--size" in err


@pytest.mark.parametrize("forward", ["return x + torch.rand_like(x)",
                                     "return torch.nn.functional.dropout(x, 0.5, training=True)"])
def test_problem_whose_forward_is_not_deterministic(capsys, tmp_path, forward):
    """No kernel can pass a check against a random reference: every config failed as a
    WRONG_RESULT that blamed the kernel, for the whole budget."""
    rc, err = run(capsys, "tune", "--op", problem(tmp_path, forward), *NULL, "--runs-dir", tmp_path / "runs")
    assert rc == 2 and "output 0 of Model.forward differs between two calls on the same inputs" in err
    assert not (tmp_path / "runs").exists()
    rc, err = run(capsys, "tune", "--op", problem(tmp_path, "return x.flip(0).cumsum(0)"), "--backend", "null",
                  "--template", FIXTURES / "kernelbench/relu_null.txt.j2", "--space",
                  FIXTURES / "kernelbench/relu_null.yaml", "--runs-dir", tmp_path / "runs", "--budget", "1", "--quiet")
    assert rc == 0  # deterministic, whatever it computes


@pytest.mark.parametrize("params, says", [
    ("  V: {range: [1, 1000000000000]}", "has 1000000000000 values; at most"),  # was a MemoryError
    ("  V: [1, 1.0]", "lists the value 1.0 twice"),
    ("  V: [.nan, 1]", "must be a finite number"),
    ("  if: [1, 2]", "reserved word"),
    ("  true: [1, 2]", "reserved word"),
    ("  V: [1, 2]\nresources:\n  V: V * 2", "has the name of a param"),
])
def test_space_mistakes_are_refused_at_load(params, says):
    with pytest.raises(SpaceError, match=says):
        parse_space(f"language: script\nparams:\n{params}\n", "s.yaml")


@pytest.mark.parametrize("text, says", [
    ("params:\n  V: [1, 2]\nconstraints:\n  - V > 5\n", "none of the 2 configs"),
    ("sizes: [Q]\nparams:\n  V: [1, 2]\n", "no size(s) ['Q']; it has ['M', 'N']"),  # sizes, not dtype/op
])
def test_a_space_that_cannot_run_at_this_shape_leaves_no_run_directory(capsys, tmp_path, text, says):
    space = tmp_path / "s.yaml"
    space.write_text("language: script\n" + text)
    rc, err = run(capsys, "tune", "softmax", "--shape", "8x16", "--backend", "null", "--template",
                  FIXTURES / "null/good.txt.j2", "--space", space, "--runs-dir", tmp_path / "runs")
    assert rc == 2 and says in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("flag", [["--parallel", "-1"], ["--seed", "-1"], ["--time-budget", "0"],
                                  ["--run-timeout", "-2"], ["--patience", "0"], ["--rounds", "0"]])
def test_out_of_range_numbers_are_refused(capsys, tmp_path, flag):
    rc, err = run(capsys, "tune", "softmax", "--shape", "8x16", *NULL, "--runs-dir", tmp_path / "runs", *flag)
    assert rc == 2 and flag[0] in err and "must be" in err
    assert not (tmp_path / "runs").exists()


def test_storage_url_of_an_unknown_database(capsys, tmp_path):
    from tuner.core.space import parse_space as ps
    from tuner.search.searcher import SearchError
    from tuner.search.study import StudyMirror
    with pytest.raises(SearchError, match="cannot open the Optuna storage 'weird://x'"):
        StudyMirror("weird://x", "run", ps("params:\n  V: [1, 2]\n"))


@pytest.mark.parametrize("storage, says", [("weird://x", "NoSuchModuleError"),
                                           ("sqlite:////no/such/dir/s.db", "unable to open database file")])
def test_a_storage_that_cannot_be_opened_leaves_no_run_behind(capsys, tmp_path, storage, says):
    rc, err = run(capsys, "tune", "softmax", "--shape", "8x16", *NULL, "--runs-dir", tmp_path / "runs",
                  "--storage", storage)
    assert rc == 2 and f"cannot open the Optuna storage {storage!r}" in err and says in err
    assert not (tmp_path / "runs").exists()


def test_warm_start_list_of_non_configs(tmp_path):
    from tuner.core.landscape import LandscapeError
    from tuner.run.warm import warm_starts
    f = tmp_path / "ws.json"
    f.write_text("[1, 2]")
    with pytest.raises(LandscapeError, match="JSON object of param -> value"):
        warm_starts([str(f)], parse_space("params:\n  V: [1, 2]\n"))


def test_null_script_with_a_zero_time_is_a_compile_error(tmp_path):
    from tuner.backends.null import NullBackend
    from tuner.core.values import Status
    b = NullBackend()
    assert b.compile("time: 0\n", builtin_spec("softmax", "8x16"), str(tmp_path), 1.0).status is Status.COMPILE_ERROR
    assert b.compile("time: nan\n", builtin_spec("softmax", "8x16"), str(tmp_path), 1.0).status is Status.COMPILE_ERROR


# ---- damaged run directories --------------------------------------------------------------

def fake_run(tmp_path, records: int = 2) -> Store:
    """A run directory as create_run leaves it, with `records` records of the good null space."""
    from tuner.core.ops import builtin_spec
    from tuner.core.settings import Settings
    from tuner.core.skeleton import load_skeleton
    from tuner.core.values import Build, Config, Measurement, Record, Status
    from tuner.run.tune import create_run
    skel = load_skeleton(FIXTURES / "null/good.txt.j2", FIXTURES / "null/good.yaml")
    store = create_run(Settings(runs_dir=str(tmp_path / "runs")), builtin_spec("softmax", "8x16"), "null",
                       skel, "random", 0, extra={"budget": 2})
    for v in range(1, records + 1):
        store.append(Record(op_key="k", skeleton_hash=skel.hash, config=Config.of({"V": v}),
                            build=Build(Status.OK), measurement=Measurement(Status.OK, samples=(1e-4,)), device="null device",
                            trial=v - 1))
    return store


@pytest.mark.parametrize("text, says", [("[]", "found a list"), ('{"format_version": 1}', "lacks op")])
def test_damaged_run_json(capsys, tmp_path, text, says):
    store = fake_run(tmp_path)
    (store.path / "run.json").write_text(text)
    for cmd in (["show", store.path], ["tune", "--resume", store.path], ["export", store.path]):
        rc, err = run(capsys, *cmd)
        assert rc == 2 and says in err


def test_resume_without_the_skeleton(capsys, tmp_path):
    store = fake_run(tmp_path)
    (store.path / "skeleton/skeleton.json").unlink()
    rc, err = run(capsys, "tune", "--resume", store.path)
    assert rc == 2 and "skeleton.json is missing" in err


@pytest.mark.parametrize("text", ["[]", "{}"])
def test_show_with_a_damaged_summary(capsys, tmp_path, text):
    store = fake_run(tmp_path)
    store.write_text("summary.json", text)
    rc, err = run(capsys, "show", store.path)
    assert rc == 2 and "summary.json is damaged" in err and "--resume" in err


def test_unparsable_last_record_line_is_dropped_before_appending(tmp_path):
    """A garbage last line that ends in a newline was skipped on read but kept on disk; the
    resumed run's first append then made it a corrupt middle line and the run unreadable."""
    store = fake_run(tmp_path)
    with open(store.path / "records.jsonl", "a") as f:
        f.write("garbage\n")
    store.repair()
    extra = fake_run(tmp_path / "other", records=3).records()[-1]
    store.append(extra)
    assert [r.config["V"] for r in store.records()] == [1, 2, 3]


def test_last_record_that_lost_only_its_newline_is_kept(tmp_path):
    store = fake_run(tmp_path)
    path = store.path / "records.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    store.repair()
    assert len(store.records()) == 2 and path.read_bytes().endswith(b"\n")


def test_records_file_that_is_a_directory(capsys, tmp_path):
    store = fake_run(tmp_path, records=0)
    (store.path / "records.jsonl").mkdir()
    rc, err = run(capsys, "tune", "--resume", store.path)
    assert rc == 2 and "records.jsonl is unreadable" in err


def test_export_to_a_file_path(capsys, tmp_path):
    store = fake_run(tmp_path)
    store.write_json("best/config.json", {"config": {"V": 1}, "median_s": 1e-4})
    store.write_text("best/kernel.txt", "time: 1e-4\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, err = run(capsys, "export", store.path, "--out", blocker)
    assert rc == 2 and "cannot write the export" in err


def test_db_update_skips_a_damaged_run(tmp_path):
    from tuner.serve.db import TuningDB
    store = fake_run(tmp_path)
    store.write_json("summary.json", {"best": {"median_s": 1e-4}})  # no config
    store.write_text("best/kernel.txt", "time: 1e-4\n")
    what, why = TuningDB(tmp_path / "db.json").add_run(store.path)
    assert what == "skipped" and "damaged" in why


# ---- resuming ------------------------------------------------------------------------------

def test_two_processes_on_one_run_are_refused(capsys, tmp_path):
    store = fake_run(tmp_path)
    with Store(store.path).lock():  # what a running `tuner tune` holds
        with pytest.raises(StoreError, match="in use by another tuner process"):
            with Store(store.path).lock():
                pass
        rc, err = run(capsys, "tune", "--resume", store.path)
        assert rc == 2 and "in use by another tuner process" in err
    with Store(store.path).lock():  # released with the holder
        pass


def test_resume_keeps_the_runs_budget(tmp_path):
    from tuner.cli.main import _run_settings
    store = fake_run(tmp_path)
    assert _run_settings(SimpleNamespace(budget=None, patience=None), store) == (2, False)  # not the default 40
    assert _run_settings(SimpleNamespace(budget=7, patience=None), store) == (7, False)
    assert json.loads((store.path / "run.json").read_text())["budget"] == 7  # for the next resume


def test_a_resume_that_asks_for_more_searches_past_a_patience_stop(capsys, tmp_path):
    """--patience stopped the run: a resume with the same settings has nothing to do, one with
    a larger --budget or another --patience gets a patience window of its own (it used to
    evaluate nothing, and the summary still named the old patience)."""
    argv = ["tune", "softmax", "--shape", "256x512", "--backend", "null", "--sampler", "random",
            "--template", FIXTURES / "null/landscape.txt.j2", "--space", FIXTURES / "null/landscape.yaml",
            "--runs-dir", tmp_path / "runs", "--quiet", "--json"]
    rc, _ = run(capsys, *argv, "--patience", "2", "--budget", "30")
    path = next((tmp_path / "runs").iterdir())

    def evaluations():
        return json.loads((path / "summary.json").read_text())["evaluations"]
    stopped = json.loads((path / "summary.json").read_text())["search_stopped"]
    first = evaluations()
    assert rc == 0 and first < 30 and stopped.startswith("--patience 2:")
    assert run(capsys, "tune", "--resume", path, "--quiet", "--json")[0] == 0
    assert evaluations() == first  # the same ask: it would only stop again
    assert run(capsys, "tune", "--resume", path, "--budget", "60", "--quiet", "--json")[0] == 0
    more = evaluations()
    assert more >= first + 2
    assert run(capsys, "tune", "--resume", path, "--patience", "5", "--quiet", "--json")[0] == 0
    summary = json.loads((path / "summary.json").read_text())
    assert summary["evaluations"] >= more + 5 and summary["search_stopped"].startswith("--patience 5:")
    meta = json.loads((path / "run.json").read_text())
    assert (meta["budget"], meta["patience"]) == (60, 5)


def test_ctrl_c_names_the_run_to_resume(capsys, tmp_path, monkeypatch):
    import tuner.cli.main

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(tuner.cli.main, "execute", interrupted)
    rc, err = run(capsys, "tune", "softmax", "--shape", "8x16", *NULL, "--runs-dir", tmp_path / "runs")
    path = next((tmp_path / "runs").iterdir())
    assert rc == 130 and f"tuner tune --resume {path}" in err


@pytest.mark.parametrize("text, says", [
    ("budget: lots\n", "`budget:` must be an integer, got 'lots'"),
    ("sampler: foo\n", "unknown sampler 'foo'"),
    ("total_time_s: -1\n", "`total_time_s:` must be positive"),
])
def test_sweep_file_mistakes_are_refused_before_any_task(tmp_path, text, says):
    from tuner.sweeps.plan import SweepError, load_plan
    f = tmp_path / "sweep.yaml"
    f.write_text(f'backend: "null"\n{text}ops:\n  softmax: {{shapes: [8x8], template: {FIXTURES}/null/good.txt.j2, '
                 f'space: {FIXTURES}/null/good.yaml}}\n')
    with pytest.raises(SweepError, match=says):
        load_plan(f)
    f.write_text('backend: "null"\nops:\n  softmax: 8x8\n')
    with pytest.raises(SweepError, match="expected a mapping"):
        load_plan(f)


def test_one_task_with_two_skeletons_is_refused_and_a_repeated_shape_runs_once(tmp_path):
    """Two entries with the same op, shape and dtype but different skeletons would share one run
    directory: the second skeleton was silently never searched."""
    from tuner.sweeps.plan import SweepError, load_plan
    f = tmp_path / "sweep.yaml"
    entry = "{{op: softmax, shapes: [8x8, 8x8], template: {0}/null/{1}.txt.j2, space: {0}/null/{1}.yaml}}"
    f.write_text(f'backend: "null"\nops:\n  a: {entry.format(FIXTURES, "good")}\n'
                 f'  b: {entry.format(FIXTURES, "landscape")}\n')
    with pytest.raises(SweepError, match="ops.b: softmax-8x8-fp32-null is a task of this sweep already, "
                                         "with another skeleton"):
        load_plan(f)
    f.write_text(f'backend: "null"\nops:\n  a: {entry.format(FIXTURES, "good")}\n'
                 f'  b: {entry.format(FIXTURES, "good")}\n')
    assert [t.key for t in load_plan(f).tasks] == ["softmax-8x8-fp32-null"]


@pytest.mark.parametrize("line, says", [("transfers: 5", "transfers is malformed"),
                                        ("cube_flops_per_cycle: [1, 2]", "cube_flops_per_cycle is malformed"),
                                        ("l2_bytes: lots", "l2_bytes must be a number"),
                                        ("transfers: {gm_to_ub: [[1]]}", "transfer curve gm_to_ub")])
def test_malformed_chip_profile(tmp_path, line, says):
    from tuner.backends.chips import ChipError, load_profile
    f = tmp_path / "chip.yaml"
    f.write_text(f"base: 910B2\nname: x\nsoc: y\n{line}\n")
    with pytest.raises(ChipError, match=says):
        load_profile(str(f))


def test_a_full_disk_stops_the_run_with_what_to_do_and_records_no_config_as_failed(capsys, tmp_path, monkeypatch):
    """The disk filled mid-run: a traceback ("a worker failed: OSError: [Errno 28]"), and the
    compiles that the full disk broke were recorded as the configs' COMPILE_ERRORs ("ld
    returned 1 exit status"), never tried again on resume. Now the run stops with what to do,
    the broken compiles record nothing, and the resume finishes the budget."""
    import shutil
    import stat

    from tuner.core.values import Status
    from tuner.run.store import Store
    monkeypatch.setenv("TUNER_BENCH_BUDGET_S", "0.005")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    count = tmp_path / "compiles"
    fake = tmp_path / "cc"  # the real compiler twice, then a full disk
    fake.write_text(f"#!/bin/sh\necho x >> {count}\nif [ $(wc -l < {count}) -le 2 ]; then exec {shutil.which('cc')} \"$@\"; fi\n"
                    "echo 'fatal error: error writing to /tmp/ccA.s: No space left on device' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(fake))
    runs = tmp_path / "runs"
    argv = ["tune", "softmax", "--shape", "16x64", "--backend", "cpu", "--budget", "5", "--parallel", "1",
            "--runs-dir", runs, "--quiet"]
    rc, err = run(capsys, *argv)
    assert rc == 1 and "error: the disk is full" in err and "No space left on device" in err, err
    run_dir = next(runs.iterdir())
    assert f"continue with `tuner tune --resume {run_dir}`" in err
    assert all(r.status is not Status.COMPILE_ERROR for r in Store.open(run_dir).records())
    monkeypatch.delenv("CC")
    assert main(["tune", "--resume", str(run_dir), "--quiet"]) == 0
    records = Store.open(run_dir).records()
    assert len(records) == 5 and all(r.status is not Status.COMPILE_ERROR for r in records)


def test_a_run_directory_that_cannot_be_written_whole_is_not_left_behind(capsys, tmp_path, monkeypatch):
    import errno

    from tuner.run.store import Store

    def full(self, meta):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Store, "write_meta", full)
    rc, err = run(capsys, "tune", "softmax", "--shape", "16x64", *NULL, "--runs-dir", tmp_path / "runs")
    assert rc == 1 and "the disk is full" in err and "run the command again" in err
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_compile_that_a_full_disk_broke_is_not_the_configs_failure():
    """The Triton backends (cuda, npu) took any exception of a compile as the config's
    COMPILE_ERROR, a full disk writing Triton's cache included."""
    import errno

    from tuner.backends.base import raise_if_disk_full
    for failure in (OSError(errno.ENOSPC, "No space left on device"), RuntimeError("ptxas: Disk quota exceeded"),
                    "ld: final link failed: No space left on device"):
        with pytest.raises(OSError) as e:
            raise_if_disk_full(failure, "here")
        assert e.value.errno == errno.ENOSPC and "(here)" in str(e.value)
    raise_if_disk_full(RuntimeError("out of resource: shared memory"), "here")  # the config's own
    raise_if_disk_full(OSError(errno.ENOENT, "No such file"), "here")


# A model writes spaces and templates: an expression or a template built to hang or exhaust
# the tool's process is refused at once, with a reason, and nothing else escapes.
@pytest.mark.parametrize("text", [
    "((2**64)**64)**64", "(((((9**64)**64)**64)**64)**64)", "'%999999999d' % 1", "'a' * 10**9", "-'a'",
    "not " * 100 + "1", "int(1e308)", "max()", "10.0**400", "cdiv(2**200, 0)", "'a' < 1", "1 in 2",
    "-" * 100 + "1", "[BM] * 10**9", "(1, 2) + (3,)",  # the first found by tests/test_fuzz.py: 12 s and GBs
])
def test_a_hostile_expression_is_an_expr_error_at_once(text):
    import time

    from tuner.core.expr import ExprError, parse
    t0 = time.monotonic()
    with pytest.raises(ExprError):
        e = parse(text)
        e({"BM": 64})
        e.violation({"BM": 64})
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("template", [
    '{{ "x"|center(10**9) }}', '{{ "x".ljust(10**9) }}', '{{ "x".zfill(999999999) }}', '{{ "%999999999d" % 1 }}',
    '{{ "{:>999999999}".format(1) }}', '{{ "{0:>{1}}".format(1, 999999999) }}', '{{ "x"|indent(10**9) }}',
    '{{ "%*d"|format(999999999, 1) }}', '{{ "%*d" % (999999999, 1) }}',
    '{% set s = namespace(v="x" * 1000) %}{% for i in range(30) %}{% set s.v = s.v.replace("x", "xx") %}{% endfor %}',
    '{% set n = namespace(v=3) %}{% for i in range(40) %}{% set n.v = n.v * n.v %}{% endfor %}',
])
def test_a_hostile_template_is_refused_at_once(template):
    import time

    from tuner.core.skeleton import Skeleton, SkeletonError
    from tuner.core.space import Space
    space = Space.from_json({"params": {"V": {"values": [1]}}})
    t0 = time.monotonic()
    with pytest.raises(SkeletonError, match="SecurityError"):
        Skeleton(template, space, "c").render(Config.of({"V": 1}), {})
    assert time.monotonic() - t0 < 1.0


def test_jinjas_lorem_ipsum_is_not_there():
    """`lipsum(10**6)` ran for minutes in Jinja's own code, out of the render deadline's sight."""
    import time

    from tuner.core.skeleton import Skeleton, SkeletonError
    from tuner.core.space import Space
    space = Space.from_json({"params": {"V": {"values": [1]}}})
    t0 = time.monotonic()
    with pytest.raises(SkeletonError, match="'lipsum' is undefined"):
        Skeleton("{{ lipsum(10**6, html=False)|length }}", space, "c").render(Config.of({"V": 1}), {})
    assert time.monotonic() - t0 < 1.0


def test_formats_and_filters_of_honest_sizes_still_render():
    from tuner.core.skeleton import Skeleton
    from tuner.core.space import Space
    space = Space.from_json({"params": {"V": {"values": [3]}}})
    out = Skeleton('{{ "%5.2f" % 1.5 }}|{{ "{:>4}".format(V) }}|{{ "a"|center(5) }}|{{ "x" * 8 }}|{{ "%d"|format(V) }}',
                   space, "c").render(Config.of({"V": 3}), {})
    assert out == " 1.50|   3|  a  |xxxxxxxx|3"


@pytest.mark.parametrize("text, says", [
    ("params:\n  BM: !foo [32, 64]\n", "s.yaml:2: not valid YAML: the tag '!foo' is not allowed"),
    ("description: !!binary aGVsbG8=\nparams:\n  BM: [32]\n", "s.yaml:1: not valid YAML: the tag"),
    ("x: &a [1, 2]\nparams:\n  BM: *a\n", "s.yaml:3: not valid YAML: an alias (*name) is not allowed"),
    ("a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nparams:\n  BM: [32]\n",
     "an alias (*name) is not allowed"),
])
def test_a_hostile_space_yaml_is_a_space_error_with_its_line(text, says):
    with pytest.raises(SpaceError) as e:
        parse_space(text, "s.yaml")
    assert says in str(e.value)


def test_a_date_in_a_space_stays_text():
    space = parse_space("description: 2024-01-01\nparams:\n  BM: [32]\n", "s.yaml")
    assert json.loads(json.dumps(space.to_json()))["meta"]["description"] == "2024-01-01"


def test_reply_parsing_is_linear_on_unclosed_tags_and_fences():
    import time

    from tuner.llm.proposer import Rejection, extract
    hostile = "<think>" * 20000 + "\n```\n" * 20000 + "x" * 100000
    t0 = time.monotonic()
    with pytest.raises(Rejection):
        extract(hostile)
    assert time.monotonic() - t0 < 2.0
    space, template = extract("<think>ignore ```yaml\nno: 1\n```</think>\n```yaml\nparams:\n  V: [1]\n```\n"
                              "```jinja\n{{ V }}\n```\n<think>unclosed")
    assert space == "params:\n  V: [1]\n" and template == "{{ V }}\n"
