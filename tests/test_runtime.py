"""tuner.serve.runtime: serve the exported table at run time (exact shapes, the nearest-shape rule,
stale toolchains, fallback), with the null backend and real C kernels.

The tests of routing and serving build their tables with `serve_slower=True`: the tiny C kernels
tuned here lose to torch once the machine is busy (each call wakes the kernel host), and an entry
that lost is not served by default; the rule itself is tested where it is named."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import FIXTURES
from tuner.codecheck import check_object
from tuner.core.ops import builtin_spec
from tuner.core.skeleton import library_skeleton, load_skeleton
from tuner.run.tune import create_run, execute
from tuner.serve.db import TuningDB, export
from tuner.serve.runtime import Table, distance, rank, sizes_of

LANDSCAPE = (FIXTURES / "null/landscape.txt.j2", FIXTURES / "null/landscape.yaml")


def exported_runs(base):
    """Every run under base/runs collected into base/db.json and exported to base/out."""
    db = TuningDB(base / "db.json")
    db.collect([base / "runs"])
    db.save()
    export(db, base / "out")
    return base / "out"


def relu_run(tmp_path, cache_dir):
    """A cpu run of the relu problem file (copied into tmp_path, 4x256) on its C skeleton,
    not yet executed: (settings, the problem file, the run's store)."""
    from tuner.core.problem import spec_from_problem_file
    from tuner.core.settings import Settings
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=1)
    problem = tmp_path / "relu.py"
    problem.write_text((FIXTURES / "kernelbench/relu.py").read_text())
    spec = spec_from_problem_file(problem, "fp32", {"batch_size": 4, "dim": 256})
    skeleton = load_skeleton(FIXTURES / "kernelbench/relu.c.j2", FIXTURES / "kernelbench/relu.yaml")
    return settings, problem, create_run(settings, spec, "cpu", skeleton, "random", 0)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, cache_dir):
    """softmax tuned on null at 256x512 and 1024x512 (landscape skeleton), and on cpu at 16x64
    (the library C skeleton), collected and exported."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from tuner.core.settings import Settings
    base = tmp_path_factory.mktemp("rt")
    settings = Settings(runs_dir=str(base / "runs"), cache_dir=cache_dir, bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=2)
    for shape in ("256x512", "1024x512"):
        store = create_run(settings, builtin_spec("softmax", shape), "null", load_skeleton(*LANDSCAPE), "random", 2)
        execute(store, settings, 10, parallel=2)
    store = create_run(settings, builtin_spec("softmax", "16x64"), "cpu", library_skeleton("softmax", "c"), "random", 2)
    execute(store, settings, 3, parallel=1)
    return exported_runs(base)


def test_the_rule():
    assert sizes_of("matmul", [torch.empty(8, 4), torch.empty(4, 16)]) == {"M": 8, "K": 4, "N": 16}
    assert distance({"M": 2048, "N": 512}, {"M": 1024, "N": 512}) == distance({"M": 512, "N": 512}, {"M": 1024, "N": 512}) == 1
    # Equal distance: the tuned shape that covers the call wins.
    call = {"M": 1024, "N": 1024}
    assert rank(call, {"M": 2048, "N": 1024}, 1.0) < rank(call, {"M": 512, "N": 1024}, 0.5)


def test_exact_shape_serves_the_verified_kernel(exported, cache_dir):
    t = Table.load(exported / "tuning.json", backend="null", cache_dir=cache_dir)
    x = torch.randn(256, 512)
    y = t("softmax", x)
    assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6)
    assert t.last is not None and t.last.exact and t.last.sizes == {"M": 256, "N": 512}
    entry = json.loads((exported / "tuning.json").read_text())["entries"]
    assert t.last.config == next(e for e in entry if e["sizes"] == {"M": 256, "N": 512})["config"]


def test_nearest_tuned_shape(exported, cache_dir):
    t = Table(json.loads((exported / "tuning.json").read_text()), backend="null", cache_dir=cache_dir)
    x = torch.randn(300, 512)
    y = t("softmax", x)
    assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6)
    assert not t.last.exact and t.last.entry["sizes"] == {"M": 256, "N": 512}  # log-distance 0.23 vs 1.77
    x = torch.randn(900, 512)
    t("softmax", x)
    assert t.last.entry["sizes"] == {"M": 1024, "N": 512}
    # A config that breaks a constraint at the call's sizes (BM <= M) is passed over; none left:
    # the torch implementation answers.
    tiny = torch.randn(8, 512)
    assert torch.allclose(t("softmax", tiny), torch.softmax(tiny, -1))
    assert t.last is None
    assert any("constraint failed" in line for line in t.explain("softmax", {"M": 8, "N": 512}))
    with pytest.raises(LookupError, match="no tuned kernel"):
        Table(json.loads((exported / "tuning.json").read_text()), backend="null", strict=True,
              cache_dir=cache_dir)("softmax", tiny)


def test_another_toolchain_is_never_served(exported, cache_dir):
    data = json.loads((exported / "tuning.json").read_text())
    for e in data["entries"]:
        e["toolchain"] = {**e["toolchain"], "null": "0"}
        e["fingerprint"] = "f" * 16
    t = Table(data, backend="null", cache_dir=cache_dir)
    x = torch.randn(256, 512)
    assert torch.allclose(t("softmax", x), torch.softmax(x, -1))
    assert t.last is None
    assert "another toolchain" in t.explain("softmax", {"M": 256, "N": 512})[0]


def test_an_entry_torch_beat_in_its_run_serves_nothing(exported, cache_dir):
    """An entry whose kernel ran slower than the op's torch implementation in its run's final
    interleave: at exactly its sizes torch runs (a config from another shape was not timed
    there at all), it is no other shape's nearest, and a model's patch leaves its op alone."""
    import torch.nn as nn

    from tuner import runtime
    data = json.loads((exported / "tuning.json").read_text())
    for e in data["entries"]:
        if e["sizes"] == {"M": 256, "N": 512} or e["backend"] == "cpu":
            e["speedup_vs_reference"] = 0.8
    t = Table(data, backend="null", cache_dir=cache_dir)
    x = torch.randn(256, 512)
    assert torch.allclose(t("softmax", x), torch.softmax(x, -1))
    assert t.last is None  # not the 1024x512 entry's config borrowed either
    why = t.explain("softmax", {"M": 256, "N": 512})
    assert "0.80x torch's own implementation" in why[0] and "exactly these sizes" in why[-1], why
    t("softmax", torch.randn(300, 512))  # nearest would be 256x512: passed over for 1024x512
    assert t.last is not None and t.last.entry["sizes"] == {"M": 1024, "N": 512}
    served = Table(data, backend="null", cache_dir=cache_dir, serve_slower=True)
    served("softmax", x)
    assert served.last is not None and served.last.exact
    # cpu: its one entry lost to torch, so no softmax call of a model is routed at all.
    cpu = Table(data, backend="cpu", cache_dir=cache_dir)
    assert "softmax" not in cpu.ops() and "softmax" in Table(data, backend="cpu", serve_slower=True).ops()

    class M(nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1)
    model = runtime.patch(M(), cpu)
    with torch.no_grad():
        model(torch.randn(16, 64))
    assert not any(v[0] for v in model.tuner_patch.stats.values())
    runtime.unpatch(model)


def test_real_c_kernel_exact_and_nearest(exported, cache_dir):
    t = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    for m in (16, 20):
        x = torch.randn(m, 64)
        y = t("softmax", x)
        assert torch.allclose(y, torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
        assert t.last is not None and t.last.exact == (m == 16)
        assert t.last.entry["backend"] == "cpu"


def test_a_kernel_the_code_check_refuses_is_never_served(exported, cache_dir):
    """A served kernel runs in the caller's process, unsandboxed: a table's kernel is checked
    again with this version's checks (a table from before a check existed, or edited)."""
    data = json.loads((exported / "tuning.json").read_text())
    entry = next(e for e in data["entries"] if e["backend"] == "cpu")
    entry["kernel"] = '#if __has_include("/etc/shadow")\n#endif\n' + entry["kernel"]
    t = Table(data, backend="cpu", cache_dir=cache_dir)
    x = torch.randn(16, 64)
    assert torch.allclose(t("softmax", x), torch.softmax(x, -1))
    assert t.last is None
    why = t.explain("softmax", {"M": 16, "N": 64})[0]
    assert "fails the code check" in why and "__has_include" in why, why


def test_a_cached_c_object_is_checked_again_before_it_is_loaded(exported, tmp_path):
    """A served C kernel is loaded into the caller's process: a cached object that this
    version's object check refuses (built by a version with fewer checks, or replaced) is
    built again from its source, not loaded."""
    import subprocess
    cache_dir = str(tmp_path / "cache")  # its own: the session's serves other tests
    t = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    x = torch.randn(16, 64)
    t("softmax", x)
    assert t.last is not None
    cached = [p for p in (Path(cache_dir) / "runtime").rglob("kernel.so")]
    assert cached
    hostile = Path(cache_dir) / "hostile.c"
    hostile.write_text("static void done(float *y) { y[0] = 0; }\n"
                       "static void *pick(void) { return (void *)done; }\n"
                       "void zero(float *y) __attribute__((ifunc(\"pick\")));\n"
                       "void tuner_kernel(const float *x, float *y) { for (int i = 0; i < 16 * 64; i++) y[i] = 0; }\n")
    for so in cached:
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(hostile), "-o", str(so)], check=True)
    again = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    assert torch.allclose(again("softmax", x), torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
    assert again.last is not None and again.last.entry["backend"] == "cpu"
    assert all(not check_object(str(so)) for so in cached)  # built again from the source


def test_exported_module(exported, cache_dir, monkeypatch):
    spec = importlib.util.spec_from_file_location("tuned_kernels", exported / "tuned_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("TUNER_CACHE_DIR", cache_dir)
    mod.table(backend="null", cache_dir=cache_dir)
    x = torch.randn(1024, 512)
    assert torch.allclose(mod.call("softmax", x), torch.softmax(x, -1), atol=1e-6)
    assert mod.lookup("softmax", {"M": 1000, "N": 512}).entry["sizes"] == {"M": 1024, "N": 512}


def test_a_table_that_is_not_one_and_an_unknown_op_say_so(exported, cache_dir, tmp_path):
    for text, says in [('{"entries": [', "is not a tuning table: not JSON"), ("[1, 2]", "no `entries` list")]:
        (tmp_path / "t.json").write_text(text)
        with pytest.raises(ValueError, match=says):
            Table.load(tmp_path / "t.json")
    with pytest.raises(FileNotFoundError, match="cannot read the tuning table .*tuner export --db"):
        Table.load(tmp_path / "missing.json")
    # A hand-edited entry: a bare KeyError or TypeError deep in a lookup before.
    good = json.loads((exported / "tuning.json").read_text())
    for edit, says in [(lambda e: e.pop("sizes"), r"entry 0 \(softmax\): 'sizes' is missing"),
                       (lambda e: e.update(sizes="256x512"), "'sizes' is str"),
                       (lambda e: e.update(sizes={"M": 0, "N": 512}), "are not positive integers")]:
        data = json.loads(json.dumps(good))
        edit(data["entries"][0])
        with pytest.raises(ValueError, match=says):
            Table(data)
    t = Table.load(exported / "tuning.json", backend="null", cache_dir=cache_dir)
    with pytest.raises(LookupError, match="unknown op 'sofmax': not a built-in op, and this table has only softmax"):
        t("sofmax", torch.randn(4, 4))


def test_inputs_the_kernel_was_not_built_for_are_never_handed_to_it(exported, cache_dir):
    """The kernel indexes raw pointers: a strided view is copied to contiguous first; an input
    of another dtype runs torch's implementation (strict: an error saying which input); an
    empty call runs torch's; a wrong `out=` is refused; sizes that disagree between inputs
    are an error. (A transposed input used to give a wrong result without a word.)"""
    t = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    view = torch.randn(64, 32).t()  # 32 x 64: the nearest tuned shape (16 x 64) serves it
    x = torch.randn(16, 128)[:, ::2]
    assert not x.is_contiguous()
    for arg in (x, view):
        assert torch.allclose(t("softmax", arg), torch.softmax(arg, -1), atol=1e-5, rtol=1e-5)
        assert t.last is not None
    y = t("softmax", x.double())
    assert t.last is None and torch.allclose(y, torch.softmax(x.double(), -1))
    assert t("softmax", torch.randn(0, 64)).shape == (0, 64) and t.last is None
    k = t.kernel("softmax", {"M": 16, "N": 64}, "fp32")
    with pytest.raises(ValueError, match=r"input x is \(16, 64\) torch.float64; the kernel for these sizes takes \(16, 64\) torch.float32"):
        k(x.double())
    with pytest.raises(ValueError, match=r"out= y must be a contiguous \(16, 64\) torch.float32 tensor"):
        k(x.contiguous(), out=[torch.empty(8, 64)])
    out = torch.empty(16, 64)
    k(x, out=[out])
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
    out.zero_()
    k(x, out=out)  # one output: the tensor itself will do
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
    assert "softmax" in repr(k) and "tuner_kernel" not in repr(k) and len(repr(k)) < 300  # not its source
    strict = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, strict=True,
                        serve_slower=True)
    with pytest.raises(LookupError, match="cannot take these inputs: input x is"):
        strict("softmax", torch.randn(8, 64), sizes={"M": 16, "N": 64})
    # Another device (meta stands in for a GPU here): a C kernel handed its pointer would crash.
    assert t("softmax", x.to("meta")).device.type == "meta" and t.last is None
    with pytest.raises(LookupError, match="input x is on meta; this kernel runs on cpu"):
        strict("softmax", torch.randn(16, 64, device="meta"))
    with pytest.raises(LookupError, match="K is 4 in one input and 5 in input 1"):
        sizes_of("matmul", [torch.empty(8, 4), torch.empty(5, 16)])


def test_a_buffer_that_starts_off_alignment_is_handed_to_the_kernel_aligned(exported, cache_dir, monkeypatch):
    """The harness hands a kernel buffers as aligned as an allocation, and a kernel may rely on
    it (16-byte loads, TMA, Triton's specialization): a contiguous input or out= that starts at
    an odd offset (a flat view) is served through an aligned copy, with the right result."""
    from tuner.serve import kernel as runtime
    t = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    k = t.kernel("softmax", {"M": 16, "N": 64}, "fp32")
    handed = []
    launch = k.backend.launch
    monkeypatch.setattr(k.backend, "launch", lambda fn, args: (handed.append([a.data_ptr() for a in args]),
                                                             launch(fn, args))[1])
    x = torch.randn(16 * 64 + 1)[1:].view(16, 64)
    assert x.is_contiguous() and x.data_ptr() % runtime.ALIGN_BYTES
    out = torch.zeros(16 * 64 + 3)[3:].view(16, 64)
    k(x, out=out)
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
    assert handed and all(p % runtime.ALIGN_BYTES == 0 for p in handed[-1])
    assert torch.allclose(k(x), torch.softmax(x, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
def test_a_table_served_on_the_gpu(tmp_path, cache_dir):
    """A Triton kernel tuned here, exported and served: exact shape, a transposed view, the
    nearest shape, and CPU tensors (torch's implementation; never the GPU kernel)."""
    from tuner.core.settings import Settings
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.01,
                        warmup_s=0.0, min_reps=3, max_reps=20)
    store = create_run(settings, builtin_spec("softmax", "256x512", "fp32"), "cuda",
                       library_skeleton("softmax", "triton"), "guided", 0)
    execute(store, settings, 4)
    exported_runs(tmp_path)
    t = Table.load(tmp_path / "out" / "tuning.json", cache_dir=cache_dir)
    for x in (torch.randn(256, 512, device="cuda"), torch.randn(512, 256, device="cuda").t(),
              torch.randn(300, 512, device="cuda")):
        assert torch.allclose(t("softmax", x), torch.softmax(x, -1), atol=1e-5, rtol=1e-5)
        assert t.last is not None and t.last.entry["backend"] == "cuda"
    y = t("softmax", torch.randn(256, 512))
    assert y.device.type == "cpu" and t.last is None


def test_launch_graphs_capture_a_buffer_set_on_its_second_call_and_keep_the_most_recent(monkeypatch):
    """The books of `LaunchGraphs` (the GPU itself: the cuda-marked test below): a buffer set's
    first call launches, its second captures and replays, later ones replay; past MAX graphs the
    least recently used goes (its set launches directly again, then is captured again); the
    sets seen once are remembered up to SEEN; a failed capture launches and captures no more;
    beyond FREE captures, one more per PAYBACK replays (a set seen again before that launches)."""
    from types import SimpleNamespace

    from tuner.serve.graphs import LaunchGraphs
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    done = []
    graphs = LaunchGraphs(lambda args: done.append(("launch", args[0].data_ptr())))
    graphs.MAX, graphs.SEEN, graphs.FREE = 2, 3, 100

    def capture(args):
        if args[0].data_ptr() == 99:
            graphs.off = "RuntimeError: refused"
            return None
        graphs.captured += 1
        return SimpleNamespace(replay=lambda p=args[0].data_ptr(): done.append(("replay", p)))
    monkeypatch.setattr(graphs, "_capture", capture)

    def call(p):
        graphs([SimpleNamespace(data_ptr=lambda: p, device=SimpleNamespace(index=0))])
        return done[-1]
    assert [call(p) for p in (1, 1, 1, 2, 2, 3, 3)] == [("launch", 1), ("replay", 1), ("replay", 1), ("launch", 2),
                                                        ("replay", 2), ("launch", 3), ("replay", 3)]
    assert list(graphs._graphs) == [(2,), (3,)]  # 1 was the least recently used
    assert [call(p) for p in (2, 1, 1)] == [("replay", 2), ("launch", 1), ("replay", 1)]
    assert list(graphs._graphs) == [(2,), (1,)]
    for p in (10, 11, 12, 13):
        call(p)
    assert list(graphs._seen) == [(11,), (12,), (13,)]
    assert [call(p) for p in (99, 99, 13)] == [("launch", 99), ("launch", 99), ("launch", 13)]
    assert graphs.off == "RuntimeError: refused"

    graphs = LaunchGraphs(lambda args: done.append(("launch", args[0].data_ptr())))
    graphs.FREE, graphs.PAYBACK = 1, 2
    monkeypatch.setattr(graphs, "_capture", capture)
    assert [call(p) for p in (1, 1, 2, 2, 1, 2, 1, 2, 2)] == [
        ("launch", 1), ("replay", 1),  # the free capture
        ("launch", 2), ("launch", 2),  # no replay yet to pay for a second
        ("replay", 1), ("launch", 2), ("replay", 1),  # two replays: one capture earned
        ("replay", 2), ("replay", 2)]
    assert graphs.captured == 2 and graphs.replays == 3

    # More buffer sets in turn than MAX graphs (the norms of a model with many layers): each
    # graph would be dropped before its set came back, a capture on every call; held to what
    # the replays of the graphs kept have earned.
    graphs = LaunchGraphs(lambda args: done.append(("launch", args[0].data_ptr())))
    graphs.MAX, graphs.FREE, graphs.PAYBACK = 4, 2, 16
    monkeypatch.setattr(graphs, "_capture", capture)
    for _ in range(20):
        for p in range(100, 110):
            call(p)
    assert graphs.captured <= graphs.FREE + graphs.replays // graphs.PAYBACK and graphs.captured <= 5
    assert done[-200:].count(("launch", 109)) >= 15  # the rest launched directly


@pytest.mark.cuda
def test_a_served_gpu_kernel_replays_its_launch_as_a_graph_on_buffers_it_has_seen(tmp_path, cache_dir, monkeypatch):
    """A buffer set's first call launches directly, its second captures a CUDA graph of the
    launch, later calls replay it, each on new contents (the graph reads them when it runs); a
    buffer set seen once launches directly; a capture that fails turns the graphs off and the
    launches stay right."""
    from tuner.core.settings import Settings
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.01,
                        warmup_s=0.0, min_reps=3, max_reps=20)
    execute(create_run(settings, builtin_spec("softmax", "256x512", "fp32"), "cuda",
                       library_skeleton("softmax", "triton"), "guided", 0), settings, 4)
    exported_runs(tmp_path)
    k = Table.load(tmp_path / "out" / "tuning.json", cache_dir=cache_dir).kernel("softmax", {"M": 256, "N": 512}, "fp32")
    direct = []
    launch = k.backend.launch
    monkeypatch.setattr(k.backend, "launch", lambda fn, args: (direct.append(torch.cuda.is_current_stream_capturing()),
                                                               launch(fn, args))[1])
    x, out = torch.empty(256, 512, device="cuda"), torch.empty(256, 512, device="cuda")
    for _ in range(5):
        x.normal_()
        k(x, out=out)
        torch.testing.assert_close(out, torch.softmax(x, -1))
    assert direct == [False, True] and k._graphs.captured == 1  # a launch, the capture, then replays
    y = torch.randn(256, 512, device="cuda")
    torch.testing.assert_close(k(y), torch.softmax(y, -1))
    assert direct[2:] == [False]

    def refuse(fn, args):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("no capture here")
        return launch(fn, args)
    monkeypatch.setattr(k.backend, "launch", refuse)
    z, zout = torch.randn(256, 512, device="cuda"), torch.empty(256, 512, device="cuda")
    for _ in range(3):
        k(z, out=zout)
        torch.testing.assert_close(zout, torch.softmax(z, -1))
    assert k._graphs.off == "RuntimeError: no capture here" and k._graphs.captured == 1
    k(x, out=out)  # a graph captured before still serves
    torch.testing.assert_close(out, torch.softmax(x, -1))


@pytest.mark.cuda
def test_a_problem_files_triton_kernel_tuned_and_served_on_the_gpu(tmp_path, cache_dir):
    """A KernelBench problem with a parameter, tuned as a Triton kernel and served with no
    sizes given: the tuned shape and a nearest one on the GPU, and fp64 (nothing tuned) by
    torch with the caller's own scale, on the GPU."""
    from tuner.core.problem import spec_from_problem_file
    from tuner.core.settings import Settings
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.01,
                        warmup_s=0.0, min_reps=3, max_reps=20)
    spec = spec_from_problem_file(FIXTURES / "kernelbench/scale.py", "fp32")
    skeleton = load_skeleton(FIXTURES / "kernelbench/scale.py.j2", FIXTURES / "kernelbench/scale_triton.yaml")
    summary = execute(create_run(settings, spec, "cuda", skeleton, "guided", 0), settings, 4)
    assert summary["best"] is not None, summary
    exported_runs(tmp_path)
    t = Table.load(tmp_path / "out" / "tuning.json", cache_dir=cache_dir)
    w = torch.randn(512, device="cuda")
    for batch in (64, 100):
        x = torch.randn(batch, 512, device="cuda")
        torch.testing.assert_close(t("scale", x, w), x * w)
        assert t.last is not None and t.last.entry["backend"] == "cuda"
    y = t("scale", x.double(), w.double())
    assert t.last is None and y.device.type == "cuda"
    torch.testing.assert_close(y, x.double() * w.double())


def test_serving_a_problem_files_kernel_leaves_the_callers_random_state_alone(tmp_path, cache_dir):
    """The runtime runs in the user's process: building a problem file's op (its model's
    parameters, its inputs) seeded torch's global generator, and the first call of a table
    ran the device's copy and matmul benchmarks. Neither happens now; an input of another
    shape than the file's runs torch's implementation."""
    settings, problem, store = relu_run(tmp_path, cache_dir)
    execute(store, settings, 2, parallel=1)
    exported_runs(tmp_path)
    torch.manual_seed(3)
    x = torch.randn(4, 256)
    state = torch.get_rng_state()
    t = Table.load(tmp_path / "out" / "tuning.json", cache_dir=cache_dir, serve_slower=True)
    assert torch.equal(t("relu", x, sizes={"batch_size": 4, "dim": 256}), torch.relu(x)) and t.last is not None
    assert torch.equal(state, torch.get_rng_state())
    short = torch.randn(2, 256)
    assert torch.equal(t("relu", short, sizes={"batch_size": 4, "dim": 256}), torch.relu(short)) and t.last is None
    # The file is the op's reference and fallback: the export keeps a copy, so that it serves
    # once moved to another machine or path (here: the original deleted, the export moved).
    problem.unlink()
    from tuner.core import ops
    ops._CACHE.clear()  # as in a new process
    (tmp_path / "out").rename(tmp_path / "moved")
    t = Table.load(tmp_path / "moved" / "tuning.json", cache_dir=cache_dir, serve_slower=True)
    assert torch.equal(t("relu", x), torch.relu(x)) and t.last is not None
    assert torch.equal(t("relu", short, sizes={"batch_size": 4, "dim": 256}), torch.relu(short)) and t.last is None
    spec = importlib.util.spec_from_file_location("tk_moved", tmp_path / "moved" / "tuned_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.table(cache_dir=cache_dir)
    assert torch.equal(module.call("relu", x), torch.relu(x))
    for copy in (tmp_path / "moved" / "problems").iterdir():
        copy.unlink()
    ops._CACHE.clear()
    with pytest.raises(ops.OpError, match=r"relu.py does not exist \(moved or deleted since it was tuned\?\)"):
        Table.load(tmp_path / "moved" / "tuning.json", cache_dir=cache_dir,
                   serve_slower=True)("relu", x, sizes={"batch_size": 4, "dim": 256})


def test_a_problem_files_table_reads_sizes_from_the_inputs_and_falls_back_with_the_callers_weights(tmp_path, cache_dir):
    """A problem file's op had no way to read its sizes from a call (`sizes=` was required:
    "cannot read 'linear''s sizes"); they are read where its get_inputs() puts them. And the
    torch fallback ran the Model's own parameters, not the weights the caller passed: a
    wrong answer without a word (fp64 inputs, which nothing tuned serves)."""
    from tuner.core.problem import size_positions, spec_from_problem_file
    from tuner.core.settings import Settings
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=1)
    problem = FIXTURES / "kernelbench/linear.py"
    assert size_positions(problem, {"batch": 8, "in_features": 64, "out_features": 32}) == \
        {"batch": (0, 0), "in_features": (0, 1)}  # out_features shows in no input of get_inputs()
    assert size_positions(FIXTURES / "kernelbench/relu.py", {"batch_size": 16, "dim": 16}) == \
        {"batch_size": (0, 0), "dim": (0, 1)}  # equal sizes told apart
    spec = spec_from_problem_file(problem, "fp32")
    skeleton = load_skeleton(FIXTURES / "kernelbench/linear.c.j2", FIXTURES / "kernelbench/linear.yaml")
    execute(create_run(settings, spec, "cpu", skeleton, "random", 0), settings, 2, parallel=1)
    exported_runs(tmp_path)
    # The exported module's example names this table's op and sizes, not softmax's.
    assert """call('linear', *inputs)""" in (tmp_path / "out" / "tuned_kernels.py").read_text()
    t = Table.load(tmp_path / "out" / "tuning.json", cache_dir=cache_dir)
    torch.manual_seed(0)
    w, b = torch.randn(32, 64), torch.randn(32)
    for batch in (8, 20):  # the tuned shape, and a nearest one (rendered at batch 20, verified)
        x = torch.randn(batch, 64)
        assert t.sizes_of("linear", [x, w, b]) == {"batch": batch, "in_features": 64, "out_features": 32}
        torch.testing.assert_close(t("linear", x, w, b), x @ w.T + b)
        assert t.last is not None
    x = torch.randn(8, 64, dtype=torch.float64)
    y = t("linear", x, w.double(), b.double())  # nothing tuned in fp64: torch, with these weights
    assert t.last is None
    torch.testing.assert_close(y, x @ w.double().T + b.double())
    w16 = torch.randn(16, 64)  # another out_features than tuned: the kernel would read past w
    torch.testing.assert_close(t("linear", x.float(), w16, b[:16]), x.float() @ w16.T + b[:16])
    assert t.last is None


def test_a_problem_file_deleted_after_its_run_began_is_read_from_the_runs_copy(tmp_path, cache_dir):
    """A run keeps its problem file (`problem.py`): the file moved or deleted later, the run
    still resumes, its winner is collected and exported, and the export serves it; before,
    each of these needed the file back at its path."""
    from tuner.run.store import Store
    settings, problem, store = relu_run(tmp_path, cache_dir)
    execute(store, settings, 1, parallel=1)
    problem.unlink()
    from tuner.core import ops
    ops._CACHE.clear()  # as in a new process
    assert Store.open(store.path).op_spec().source == str(store.path / "problem.py")
    summary = execute(Store.open(store.path), settings, 2, parallel=1)  # a resume with more budget
    assert len(Store.open(store.path).records()) > 1 and summary["best"] is not None
    out = exported_runs(tmp_path)
    assert [p.name.split("-")[0] for p in (out / "problems").iterdir()] == ["relu"]
    ops._CACHE.clear()
    x = torch.randn(4, 256)
    t = Table.load(out / "tuning.json", cache_dir=cache_dir)
    assert torch.equal(t("relu", x), torch.relu(x)) and t.last is not None


def test_patch_routes_a_models_calls_to_the_tuned_kernels_and_undoes(exported, cache_dir):
    """softmax was tuned on cpu at 16x64: a model's softmax over (2, 8, 64) folds to 16x64 and
    runs the tuned kernel; the same model on (4, 64) falls back to torch; unpatch restores it."""
    import torch.nn as nn

    from tuner import runtime

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, x):
            return torch.softmax(self.lin(x), dim=-1) * 2

    table = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    model = M().eval()
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        want = model(x)
        assert runtime.patch(model, table) is model
        got = model(x)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
        assert dict(model.tuner_patch.stats) == {"softmax 16x64 fp32": [1, 0]}
        model(torch.randn(4, 64))  # no kernel tuned at 4x64: torch's own
        assert model.tuner_patch.stats["softmax 4x64 fp32"] == [0, 1]
    with torch.enable_grad():  # autograd would record the call: torch's own, not counted
        model(torch.randn(2, 8, 64, requires_grad=True))
    assert model.tuner_patch.stats["softmax 16x64 fp32"] == [1, 0]
    runtime.unpatch(model)
    assert "forward" not in model.__dict__ and not hasattr(model, "tuner_patch")
    with torch.no_grad():
        assert torch.allclose(model(x), want)


def test_function_routes_take_over_only_the_tables_entry_points_and_only_during_the_forward(exported, cache_dir, monkeypatch):
    """The function routes cost host time only on calls of the ops the table holds: torch's
    entry points of those ops (softmax here: torch.softmax, F.softmax, Tensor.softmax) stand
    replaced while the patched forward runs and are torch's own again after it, after an
    error in it, and after unpatch; the rest of torch is never touched; a call made by another
    thread during the forward is torch's own."""
    import threading

    import torch.nn as nn
    import torch.nn.functional as F

    from tuner import runtime
    from tuner.serve import routes

    handled = []
    own_softmax = routes._softmax
    monkeypatch.setattr(routes, "_softmax", lambda p, args, kwargs: (handled.append(1), own_softmax(p, args, kwargs))[1])

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp, self.fail = nn.Sequential(nn.Linear(64, 64), nn.GELU()), False
            self.elsewhere = None

        def forward(self, x):
            h = F.softmax(x, dim=-1) + self.mlp(x) @ torch.eye(64)
            if self.fail:
                raise RuntimeError("in the forward")
            t = threading.Thread(target=lambda: setattr(self, "elsewhere", torch.softmax(x, -1)))
            t.start()
            t.join()
            return h.softmax(-1)

    entry_points = {"torch.softmax": torch.softmax, "F.softmax": F.softmax, "mm": torch.mm, "matmul": torch.Tensor.__matmul__}
    table = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        model = M().eval()
        want = model(x)
        runtime.patch(model, table, functions=True)
        torch.testing.assert_close(model(x), want)
        assert len(handled) == 2  # the forward's two softmax calls; not the matmul, not the other thread's
        assert model.tuner_patch.stats["softmax 16x64 fp32"] == [2, 0]
        torch.testing.assert_close(model.elsewhere, torch.softmax(x, -1))
        assert {"torch.softmax": torch.softmax, "F.softmax": F.softmax, "mm": torch.mm,
                "matmul": torch.Tensor.__matmul__} == entry_points and "softmax" not in vars(torch.Tensor)
        model.fail = True
        with pytest.raises(RuntimeError, match="in the forward"):
            model(x)
        assert torch.softmax is entry_points["torch.softmax"] and "softmax" not in vars(torch.Tensor)
        model.fail = False
        runtime.unpatch(model)
        assert not any("forward" in m.__dict__ for m in model.modules())
        handled.clear()
        torch.testing.assert_close(model(x), want)
        assert handled == []


def test_verify_says_which_patched_variant_is_slower_than_the_model_unpatched():
    from tuner.model.advice import slower
    assert slower({"eager": 1.0, "patched eager": 1.01, "torch.compile": 0.5, "patched + torch.compile": 0.4}) == []
    said = slower({"eager": 1.0, "patched eager": 0.9, "torch.compile": 0.81, "patched + torch.compile": 1.08})
    assert said == ["patched + torch.compile is slower than torch.compile (0.75x): the routed calls cost more than "
                    "they save here under torch.compile (which to keep: below)"]
    assert len(slower({"eager": 1.0, "patched eager": 1.1})) == 1


def test_verify_says_which_routes_to_keep_under_torch_compile():
    """After patched + torch.compile measured slower than torch.compile: the ops that were
    faster routed alone than left to the compiler, or none, as the `under_compile=` to pass."""
    from tuner.model.advice import compile_advice
    said = compile_advice(["rmsnorm", "swiglu"], [("rmsnorm", 1.2, 1.0), ("swiglu", 0.9, 1.0)])
    assert said.startswith("under torch.compile, route only swiglu: runtime.patch(model, table, "
                           "under_compile={'swiglu'})")
    assert "only rmsnorm routed: 0.83x torch.compile" in said
    none = compile_advice(["rmsnorm", "swiglu"], [("rmsnorm", 1.2, 1.0), ("swiglu", 0.995, 1.0)])  # inside the noise
    assert none.startswith("under torch.compile, leave rmsnorm, swiglu to the compiler (routed in eager mode only): "
                           "runtime.patch(model, table, under_compile=())")
    assert compile_advice(["rmsnorm"], []).endswith("under_compile=())")


def test_verify_measures_which_routes_pay_in_eager_mode(monkeypatch):
    """After patched eager measured slower than eager with several ops routed: the model
    patched with one op at a time, each timed against eager end to end (its route's own host
    time counted, which the per-op table leaves out); the ops that paid alone are then timed
    routed together, and the advice names them as `ops=` with every figure measured. A variant
    whose outputs miss the bound is said and not timed."""
    import tuner.model.advice as advice
    import tuner.model.verify as verify
    import tuner.serve.patch as sp
    state = {}

    class Routed:  # the model patched with `ops` only; its outputs wrong when swiglu alone is routed
        def __init__(self, ops):
            self.ops = frozenset(ops)

        def __call__(self, x):
            state["last"] = self.ops
            return x + (0.5 if self.ops == {"swiglu"} else 0.0)

    made = []
    monkeypatch.setattr(sp, "patched_copy", lambda model, table, ops=None: made.append(frozenset(ops)) or Routed(ops))
    monkeypatch.setattr(sp, "unpatch", lambda m: None)
    seconds = {frozenset({"rmsnorm"}): 0.9, frozenset({"rope"}): 1.1, frozenset({"attention_decode"}): 0.97,
               frozenset({"attention_decode", "rmsnorm"}): 0.85}

    def interleaved(fns, sync, rounds):
        fns["only"]()
        return {"eager": 1.0, "only": seconds[state["last"]]}
    monkeypatch.setattr(verify, "interleaved", interleaved)
    notes = []
    ops = ["attention_decode", "rmsnorm", "rope", "swiglu"]
    x = torch.zeros(4)
    got = verify.routes_in_eager(None, None, [x], lambda: None, 3, ops, None, [x], 0.1, notes)
    assert made == [frozenset({op}) for op in ops] + [frozenset({"attention_decode", "rmsnorm"})]
    assert got == [("attention_decode", 0.97, 1.0), ("rmsnorm", 0.9, 1.0), ("rope", 1.1, 1.0),
                   ("attention_decode+rmsnorm", 0.85, 1.0)]
    assert notes == ["patched eager routing only swiglu: error 0.5 > allowed 0.1"]
    assert advice.routes_advice(ops, got) == (
        "in eager mode, route only attention_decode, rmsnorm: runtime.patch(model, table, ops={'attention_decode', "
        "'rmsnorm'}) (tuner run/verify --ops attention_decode,rmsnorm); only attention_decode routed: 1.03x eager; only rmsnorm routed: 1.11x eager; only rope routed: "
        "0.91x eager; attention_decode, rmsnorm routed together: 1.18x eager")
    slow_together = got[:3] + [("attention_decode+rmsnorm", 0.99, 1.0)]  # each paid alone, not both
    assert advice.routes_advice(ops, slow_together).startswith(
        "in eager mode, route only rmsnorm: runtime.patch(model, table, ops={'rmsnorm'}) (tuner run/verify --ops "
        "rmsnorm); only attention_decode")
    assert advice.routes_advice(ops, slow_together).endswith("attention_decode, rmsnorm routed together: 1.01x eager")
    assert advice.routes_advice(["rope"], [("rope", 1.2, 1.0)]) == (
        "in eager mode no route paid alone (rope): run the model unpatched in eager mode; only rope routed: 0.83x eager")


def test_verify_says_which_ops_to_route_in_eager_mode():
    """From the per-op table (per forward: calls x each side's time alone): the ops whose tuned
    calls take longer than torch's by more than the noise margin, and the `ops=` that keeps the
    rest; nothing when every op pays or ties."""
    from tuner.model.advice import eager_advice
    rows = [("rmsnorm 16x4096 bf16", 2, 137e-6, 27e-6, 0.0), ("swiglu 16x14336 bf16", 1, 24.9e-6, 24.3e-6, 0.0),
            ("attention_decode 16x32x8x4097x128 bf16", 1, 74.6e-6, 79.4e-6, 0.0)]
    said = eager_advice(rows)
    assert said == ("in eager mode attention_decode cost more routed than torch's own (attention_decode 79.4 us "
                    "tuned against 74.6 us for torch's in a forward): runtime.patch(model, table, ops={'rmsnorm', 'swiglu'})")
    assert eager_advice(rows[:2]) is None
    assert eager_advice([("swiglu 4x512 fp32", 1, 1e-6, 2e-6, 0.0)]).endswith("route none of them: run the model "
                                                                               "unpatched in eager mode")


def test_verify_says_when_no_kernel_for_the_routed_calls_could_reach_torch_compile():
    """Routing's ceiling: each call's torch time less its floor (bytes at copy bandwidth), times
    its calls per forward, the route free. Said only when torch.compile's gain over eager in the
    same run is larger; never without a floor for every routed call."""
    from tuner.model.advice import most_saved, routing_ceiling
    rows = [("rmsnorm 16x4096 bf16", 2, 67e-6, 27e-6, 80e-6), ("rope 16x32x128 bf16", 1, 59e-6, 12e-6, 47e-6),
            ("swiglu 16x14336 bf16", 0, 14e-6, 11e-6, 0.0)]
    floors = {"rmsnorm 16x4096 bf16": 1e-6, "rope 16x32x128 bf16": 4e-6, "swiglu 16x14336 bf16": 2e-6}
    assert most_saved(rows, floors) == pytest.approx(2 * 66e-6 + 55e-6)
    assert most_saved(rows, {k: v for k, v in floors.items() if not k.startswith("rope")}) is None
    assert most_saved(rows, {**floors, "rope 16x32x128 bf16": 1.0}) == pytest.approx(2 * 66e-6)  # a floor above torch's
    said = routing_ceiling(rows, floors, {"eager": 1132e-6, "torch.compile": 600e-6, "patched eager": 1296e-6})
    assert said == ("patched eager cannot reach torch.compile here by tuning these ops: torch.compile saved 532.0 us "
                    "per forward over eager; routing every call above could save at most 187.0 us (each call's "
                    "bytes at copy bandwidth, its route free); the rest of compile's gain is in the model's other "
                    "operations")
    assert routing_ceiling(rows, floors, {"eager": 1132e-6, "torch.compile": 1000e-6}) is None  # within reach
    assert routing_ceiling(rows, floors, {"eager": 1132e-6, "patched eager": 1000e-6}) is None  # compile not timed
    assert routing_ceiling(rows, {}, {"eager": 1132e-6, "torch.compile": 600e-6}) is None


def test_ops_limits_what_the_patch_routes(exported, cache_dir):
    """`ops=`: the only ops routed, eager and under torch.compile alike; a softmax the table
    serves runs torch's own when softmax is left out, an op the table lacks is warned of, and
    an unknown name is refused."""
    import torch.nn as nn

    from tuner import runtime

    class M(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)

    table = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    x = torch.randn(16, 64)
    with torch.no_grad():
        kept = runtime.patch(M(), table, functions=True, ops={"softmax"})
        kept(x)
        with pytest.warns(UserWarning, match="the table holds no kernel for rmsnorm"):
            left = runtime.patch(M(), table, functions=True, ops={"rmsnorm"})
        torch.testing.assert_close(left(x), torch.softmax(x, -1))
    assert kept.tuner_patch.stats["softmax 16x64 fp32"] == [1, 0]
    assert dict(left.tuner_patch.stats) == {}
    with pytest.raises(ValueError, match="ops: softmx is not an op the patch routes"):
        runtime.patch(M(), table, ops={"softmx"})


def test_under_compile_names_ops_the_patch_routes(exported, cache_dir):
    import torch.nn as nn

    from tuner import runtime
    table = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="rmsnrom is not an op the patch routes; one of attention_decode, layernorm, matmul"):
        runtime.patch(nn.Linear(4, 4), table, under_compile={"rmsnrom"})
    with pytest.raises(TypeError, match="a set of op names"):
        runtime.patch(nn.Linear(4, 4), table, under_compile="swiglu")
    assert runtime.patch(nn.Linear(4, 4), table, under_compile=["swiglu"]).tuner_patch.under_compile == {"swiglu"}


def test_verify_passes_a_right_patch_and_catches_a_wrong_one(exported, cache_dir, tmp_path, monkeypatch):
    from tuner.model.verify import verify
    from tuner.serve import runtime as rt
    model = tmp_path / "m.py"
    model.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                     "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(64, 64)\n\n"
                     "    def forward(self, x):\n        return torch.softmax(self.lin(x), dim=-1)\n\n\n"
                     "def get_inputs():\n    return [torch.randn(2, 8, 64)]\n\n\n"
                     "def get_init_inputs():\n    return []\n")
    table = Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir, serve_slower=True)
    v = verify(model, table, "cpu", rounds=3, compile=False)
    assert v.passed and v.error <= v.allowed and v.routed == (("softmax 16x64 fp32", 1, 0),)
    assert {k for k, _ in v.medians_s} == {"eager", "patched eager"}
    launch = rt.Kernel._launch
    monkeypatch.setattr(rt.Kernel, "_launch", lambda self, inputs, out=None: launch(self, inputs, out) * 1.001)
    wrong = verify(model, table, "cpu", rounds=1, compile=False)
    assert not wrong.passed and wrong.error > wrong.allowed


def test_under_torch_compile_only_a_call_the_table_serves_is_opaque(exported, tmp_path, cache_dir):
    """An RMSNorm tuned on cpu at 4x64 fp32: under torch.compile a call it serves is the
    `tuner::routed` custom op in the traced graph; a call it cannot serve (fp64) is the module's
    own forward, traced, for the compiler to fuse. A table without the op replaces no module."""
    import torch.nn as nn

    from tuner import runtime
    from tuner.core.settings import Settings

    class Norm(nn.Module):  # as transformers writes its RMSNorm
        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = nn.Parameter(torch.rand(64) + 0.5), 1e-6

        def forward(self, x):
            v = x.float().pow(2).mean(-1, keepdim=True)
            return self.weight * (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = Norm()

        def forward(self, x):
            return self.norm(x + 1) * 2

    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=1)
    execute(create_run(settings, builtin_spec("rmsnorm", "4x64"), "cpu", library_skeleton("rmsnorm", "c"), "random", 0),
            settings, 1)
    # Served whatever its timing (a busy machine timed a tiny kernel slower than torch, and then
    # no call was routed): this is about routing.
    table = Table.load(exported_runs(tmp_path) / "tuning.json", backend="cpu", cache_dir=cache_dir,
                       serve_slower=True)

    def traced_ops(model, x) -> set[str]:
        graphs = []
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=lambda gm, _: (graphs.append(gm), gm.forward)[1])
        torch.testing.assert_close(compiled(x), model(x))
        return {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}

    with torch.no_grad():
        model = runtime.patch(M().eval(), table)
        assert model.tuner_patch.modules == {"norm": "rmsnorm"}
        assert any("tuner.routed" in t for t in traced_ops(model, torch.randn(4, 64)))
        assert not any("tuner.routed" in t for t in traced_ops(model.double(), torch.randn(4, 64, dtype=torch.float64)))
        softmax_only = runtime.patch(M().eval(), Table.load(exported / "tuning.json", backend="cpu", cache_dir=cache_dir))
        assert softmax_only.tuner_patch.modules == {}
        # under_compile: the ops left routed while torch.compile traces; the others eager only
        eager_only = runtime.patch(M().eval(), table, under_compile=())
        assert not any("tuner.routed" in t for t in traced_ops(eager_only, torch.randn(4, 64)))
        eager_only(torch.randn(4, 64))
        assert eager_only.tuner_patch.stats["rmsnorm 4x64 fp32"][0] >= 1  # still routed in eager
        kept = runtime.patch(M().eval(), table, under_compile={"rmsnorm"})
        assert any("tuner.routed" in t for t in traced_ops(kept, torch.randn(4, 64)))


@pytest.mark.parametrize("backend, language, dtype", [
    ("cpu", "c", "fp32"), pytest.param("cuda", "triton", "bf16", marks=pytest.mark.cuda)])
def test_sdpa_at_a_decode_step_is_routed_eager_and_under_torch_compile(tmp_path, cache_dir, backend, language, dtype):
    """attention_decode tuned (the library's C skeleton on cpu, Triton on cuda) at 2x4x2x40x16: a model's SDPA call of one
    query per sequence against a grouped KV cache (as transformers makes it at decode: q
    transposed from [B, 1, H, D], scale 1/sqrt(D) given) runs the tuned kernel in eager mode
    and is the `tuner::routed` custom op in the graph torch.compile traces; the calls it does
    not compute (a mask, causal, two queries) stay torch's; heads not grouped (KH = H) are
    the op too (served here by the nearest tuned shape's config)."""
    import torch.nn as nn
    import torch.nn.functional as F

    from tuner import runtime
    from tuner.core.settings import Settings

    class Decode(nn.Module):
        def __init__(self, mask=None, causal=False, gqa=True):
            super().__init__()
            self.proj = nn.Linear(64, 64)
            self.mask, self.causal, self.gqa = mask, causal, gqa

        def forward(self, x, k, v):  # x: [B, L, 64], k, v: [B, 2, S, 16]
            q = self.proj(x).view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal,
                                               scale=16 ** -0.5, enable_gqa=self.gqa)
            return o.transpose(1, 2).reshape(x.shape[0], x.shape[1], 64) * 2

    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=1)
    summary = execute(create_run(settings, builtin_spec("attention_decode", "2x4x2x40x16", dtype), backend,
                                 library_skeleton("attention_decode", language), "random", 0), settings, 2)
    assert summary["best"] is not None, summary["failures"]
    table = Table.load(exported_runs(tmp_path) / "tuning.json", backend=backend, cache_dir=cache_dir,
                       serve_slower=True)
    dev, dt = ("cuda" if backend == "cuda" else "cpu"), (torch.bfloat16 if dtype == "bf16" else torch.float32)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == "fp32" else {"atol": 2e-2, "rtol": 2e-2}
    x, k, v = (torch.randn(*s, device=dev, dtype=dt) for s in ((2, 1, 64), (2, 2, 40, 16), (2, 2, 40, 16)))
    key = f"attention_decode 2x4x2x40x16 {dtype}"
    with torch.no_grad():
        model = Decode().eval().to(dev, dt)
        want = model(x, k, v)
        runtime.patch(model, table)
        torch.testing.assert_close(model(x, k, v), want, **tol)
        assert model.tuner_patch.stats[key] == [1, 0]
        for other, args in ((Decode(mask=torch.ones(1, 40, dtype=torch.bool, device=dev)), (x, k, v)),
                            (Decode(causal=True), (x, k, v)),
                            (Decode(), (torch.randn(2, 2, 64, device=dev, dtype=dt), k, v)),
                            (Decode(gqa=False), (x, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))):
            other.eval().to(dev, dt).load_state_dict(model.state_dict())
            want_other = other(*args)
            runtime.patch(other, table)
            torch.testing.assert_close(other(*args), want_other, **tol)
            routed = {name for name, c in other.tuner_patch.stats.items() if c[0]}
            assert routed == ({f"attention_decode 2x4x4x40x16 {dtype}"} if not other.gqa else set()), routed

        graphs = []
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=lambda gm, _: (graphs.append(gm), gm.forward)[1])
        torch.testing.assert_close(compiled(x, k, v), want, **tol)
        traced = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
        assert any("tuner.routed" in t for t in traced) and not any("scaled_dot_product" in t for t in traced), traced
        assert model.tuner_patch.stats[key][0] >= 2
        runtime.unpatch(model)
        assert "forward" not in model.__dict__


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # as transformers writes it, in this module
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RopeAttention(torch.nn.Module):
    """q (4 heads) and k (2 heads) projected, viewed [B, H, S, D] as transformers does, and
    rotated by this module's apply_rotary_pos_emb."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = torch.nn.Linear(64, 64), torch.nn.Linear(64, 32)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, 4, 16).transpose(1, 2)
        k = self.k_proj(x).view(b, s, 2, 16).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return torch.cat([q.transpose(1, 2).reshape(b, s, 64), k.transpose(1, 2).reshape(b, s, 32)], -1)


class Rotary(torch.nn.Module):
    """cos and sin [B, S, 16] of positions, as transformers' rotary embeddings make them
    (`shift`: the second half's angles moved, not rope's repeated angles)."""

    def __init__(self, shift=0.0):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16), persistent=False)
        self.shift = shift

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs + self.shift), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class RopeModel(torch.nn.Module):
    def __init__(self, shift=0.0):
        super().__init__()
        self.rotary, self.attn = Rotary(shift), RopeAttention()

    def forward(self, x):
        pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
        return self.attn(x, *self.rotary(x, pos))


INTERLEAVED = '''
import torch
def apply_rotary_pos_emb(q, k, cos, sin):  # interleaved pairs (GPT-J style): not the library's rope
    def rot(x):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x2, x1), -1).flatten(-2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin
class Attention(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)
'''


def test_a_models_rope_function_runs_as_two_rope_calls_while_its_forward_runs(tmp_path, cache_dir, monkeypatch):
    """rope tuned on cpu at q's and k's token shapes (12x4x16, 12x2x16): the model's own
    apply_rotary_pos_emb (found in the module that defines the model's class, taken because
    the probe agrees it is rotate-half rope) runs as the two tuned calls while the patched
    forward runs, and is the model's own again after it and after unpatch; cos and sin whose
    halves differ (not angles repeated) fall back to the function; cos and sin from a rotary
    embedding module that a probe found to repeat its angles are routed without reading them
    (no sync); a function of that name that computes another rotation (interleaved pairs) is
    never taken."""
    import math
    import sys
    import types

    from tuner import runtime
    from tuner.core.settings import Settings
    from tuner.serve import routes
    from tuner.serve.routes import model_functions
    settings = Settings(runs_dir=str(tmp_path / "runs"), cache_dir=cache_dir, bench_budget_s=0.005,
                        warmup_s=0.0, min_reps=3, max_reps=20, compile_workers=1)
    for shape in ("12x4x16", "12x2x16"):
        summary = execute(create_run(settings, builtin_spec("rope", shape), "cpu", library_skeleton("rope", "c"),
                                     "random", 0), settings, 2)
        assert summary["best"] is not None, summary["failures"]
    # Served whatever its timing (a busy machine timed a tiny kernel slower than torch, and then
    # no call was routed): this is about routing.
    table = Table.load(exported_runs(tmp_path) / "tuning.json", backend="cpu", cache_dir=cache_dir,
                       serve_slower=True)
    here = sys.modules[RopeAttention.__module__]
    own = here.apply_rotary_pos_emb
    torch.manual_seed(0)
    x = torch.randn(2, 6, 64)
    theta = torch.rand(2, 6, 8) * (2 * math.pi)
    cos, sin = torch.cat([theta.cos()] * 2, -1), torch.cat([theta.sin()] * 2, -1)
    with torch.no_grad():
        model = RopeAttention().eval()
        want = model(x, cos, sin)
        runtime.patch(model, table)
        assert model.tuner_patch.model_functions == {f"{here.__name__}.apply_rotary_pos_emb": "rope"}
        torch.testing.assert_close(model(x, cos, sin), want, atol=1e-5, rtol=1e-5)
        assert model.tuner_patch.stats["rope 12x4x16 fp32"] == [1, 0]
        q, k = model.q_proj(x).view(2, 6, 4, 16).transpose(1, 2), model.k_proj(x).view(2, 6, 2, 16).transpose(1, 2)
        with routes.TakenOver(model.tuner_patch, ((here, "apply_rotary_pos_emb", routes.HANDLERS["rope"]),)):
            got = here.apply_rotary_pos_emb(q, k, cos, sin)
            # q made contiguous [B, H, S, D]: not the projection's layout, the function's own
            assert here.apply_rotary_pos_emb(q.contiguous(), k, cos, sin)[0].is_contiguous()
        assert [t.stride() for t in got] == [t.stride() for t in own(q, k, cos, sin)]  # eager's layout
        assert model.tuner_patch.stats["rope 12x4x16 fp32"] == [2, 0]
        assert model.tuner_patch.stats["rope 12x2x16 fp32"] == [2, 0]
        assert here.apply_rotary_pos_emb is own
        # halves that differ: the function's own result, nothing counted as routed
        cos2, sin2 = torch.rand(2, 6, 16), torch.rand(2, 6, 16)
        torch.testing.assert_close(model(x, cos2, sin2), RopeAttention.forward(model, x, cos2, sin2))
        assert model.tuner_patch.stats["rope 12x4x16 fp32"] == [2, 0]
        # a cos and sin for one sequence, broadcast over the batch
        torch.testing.assert_close(model(x, cos[:1], sin[:1]), RopeAttention.forward(model, x, cos[:1], sin[:1]),
                                   atol=1e-5, rtol=1e-5)
        assert model.tuner_patch.stats["rope 12x4x16 fp32"] == [3, 0]
        runtime.unpatch(model)
        assert here.apply_rotary_pos_emb is own and "forward" not in model.__dict__

    # cos and sin from a rotary embedding the probe takes: routed without reading them (no
    # torch.equal, no sync); one whose halves differ is not taken, and its calls fall back.
    from tuner.serve.routes import rotary_producers
    equal_calls = []
    real_equal = torch.equal
    monkeypatch.setattr(torch, "equal", lambda *a: equal_calls.append(1) or real_equal(*a))
    with torch.no_grad():
        for shift, routed in ((0.0, True), (0.3, False)):
            m = RopeModel(shift).eval()
            assert [type(r) for r in rotary_producers(m)] == ([Rotary] if routed else [])
            want = m(x)
            runtime.patch(m, table)
            equal_calls.clear()
            torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)
            assert m.tuner_patch.stats.get("rope 12x4x16 fp32", [0, 0])[0] == (1 if routed else 0)
            assert (equal_calls == []) == routed
            runtime.unpatch(m)
            assert not m.rotary._forward_hooks

    other = types.ModuleType("interleaved_rope_model")
    exec(INTERLEAVED, other.__dict__)
    sys.modules[other.__name__] = other
    try:
        assert model_functions(other.Attention()) == ()
    finally:
        del sys.modules[other.__name__]



def test_a_borrowed_config_is_checked_on_inputs_it_cannot_know_in_advance():
    """A kernel right only on inputs it recognises (the check's, were its seed fixed) is wrong at
    the call's sizes everywhere else: the check before its first use must refuse it. The same
    check passes an honest kernel."""
    from tuner.backends.null import NullBackend
    from tuner.core.ops import load_op
    from tuner.serve.kernel import Kernel, verified_here
    op = load_op(builtin_spec("softmax", "32x64"))
    known = {seed: op.make_inputs(seed)[0] for seed in (1, 42, 12345)}  # seeds a check might fix

    def recogniser(args):
        x, y = args
        hit = any(torch.equal(x, k) for k in known.values())
        y.copy_(torch.softmax(x, -1) if hit else torch.zeros_like(y))

    def honest(args):
        x, y = args
        y.copy_(torch.softmax(x.double(), -1).to(y.dtype))

    def kernel(fn):
        return Kernel(entry={}, sizes={"M": 32, "N": 64}, exact=False, distance=1.0,
                      backend=NullBackend(), op=op, fn=fn)
    assert not any(verified_here(kernel(recogniser)) for _ in range(3))
    assert all(verified_here(kernel(honest)) for _ in range(3))
