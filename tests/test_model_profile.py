"""`tuner profile`: a model's operator calls ranked by time, matched to library ops, and the
hot ones written out as a sweep and as problem files that reproduce each call exactly."""

import json
from pathlib import Path

import pytest
import torch

from tuner.cli import NO_WINNER
from tuner.cli.main import main
from tuner.model.emit import emit_sweep
from tuner.model.profile import profile_model

MODEL = '''import torch
import torch.nn as nn
import torch.nn.functional as F

hidden = 64
tokens = 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        h = self.norm(x)
        a = torch.softmax(torch.mm(h, h.t()), dim=-1)
        return x + self.down(F.gelu(self.up(torch.mm(a, h))))


class Model(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def get_inputs():
    return [torch.randn(tokens, hidden)]


def get_init_inputs():
    return [3]
'''


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(MODEL)
    return p


def test_every_operator_call_is_counted_at_its_shapes(model):
    prof = profile_model(model, "cpu", iterations=2, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    rows = {(r.aten, r.shapes): r for r in prof.rows}
    # Three blocks: each call once per block per forward, counted per forward.
    assert rows[("module::layernorm", "32x64, 64, 64")].calls == 3  # nn.LayerNorm: a module the patch routes
    assert rows[("aten::softmax", "32x32")].calls == 3
    assert rows[("aten::linear", "32x64, 256x64, 256")].calls == 3
    assert rows[("aten::linear", "32x256, 64x256, 64")].calls == 3
    assert rows[("aten::gelu", "32x256")].calls == 3
    assert rows[("aten::mm", "32x64, 64x32")].calls == 3 and rows[("aten::mm", "32x32, 32x64")].calls == 3
    assert not any(r.aten == "aten::addmm" for r in prof.rows)  # inside linear: counted there
    assert sum(r.share for r in prof.rows) == pytest.approx(1.0)
    assert [r.total_s for r in prof.rows] == sorted((r.total_s for r in prof.rows), reverse=True)
    # Library ops that compute exactly these calls; a bound and an Amdahl saving per row.
    assert rows[("aten::softmax", "32x32")].library == ("softmax", "32x32", "fp32")
    assert rows[("module::layernorm", "32x64, 64, 64")].library == ("layernorm", "32x64", "fp32")
    assert rows[("aten::mm", "32x64, 64x32")].library == ("matmul", "32x32x64", "fp32")
    assert rows[("aten::linear", "32x64, 256x64, 256")].library is None  # x @ w.T + b: not the library's
    mm = rows[("aten::mm", "32x64, 64x32")]
    assert mm.flops == 2 * 32 * 32 * 64 and mm.bytes == 4 * (32 * 64 * 2 + 32 * 32)
    for r in prof.rows:
        assert r.bound_s is not None and 0 <= r.saving <= r.share


def test_emit_adds_a_task_per_other_language_that_can_run_the_call(model, tmp_path):
    """`also` names the backend's other languages for a call (cuda: the CUDA C++ skeleton where
    its space fits the shape): each becomes an entry of its own with `language:`."""
    from tuner.cli.profile import other_languages
    from tuner.sweeps.plan import load_plan
    prof = profile_model(model, "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    path = emit_sweep(prof, tmp_path / "hot.yaml", "cpu", top=20, min_share=0.0,
                      also=lambda op, shape, dtype: ["c"] if op == "softmax" else [])
    tasks = {(t.op, t.shape, t.language) for t in load_plan(path).tasks}
    assert ("softmax", "32x32", "c") in tasks and ("softmax", "32x32", None) in tasks
    assert not any(lang for op, _, lang in tasks if op != "softmax")
    assert other_languages("cpu") is None


def test_emitted_sweep_and_problem_files_reproduce_the_calls(model, tmp_path):
    from tuner.core.ops import load_op
    from tuner.core.problem import spec_from_problem_file
    from tuner.sweeps.plan import load_plan
    prof = profile_model(model, "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    path = emit_sweep(prof, tmp_path / "out" / "hot.yaml", "cpu", top=20, min_share=0.0)
    plan = load_plan(path)
    tasks = {(t.op, t.shape) for t in plan.tasks}
    assert {("softmax", "32x32"), ("layernorm", "32x64"), ("matmul", "32x32x64"), ("matmul", "32x64x32")} <= tasks
    problems = sorted((tmp_path / "out" / "hot_problems").glob("*.py"))
    names = {p.stem.split("_", 1)[1] for p in problems}
    assert {"linear", "gelu", "add"} <= names  # add: its alpha is keyword-only in the schema
    assert "torch.ops.aten.add(in0, in1, alpha=1)" in next(p for p in problems if p.stem.endswith("_add")).read_text()
    for p in problems:
        op = load_op(spec_from_problem_file(p))
        xs = op.make_inputs(3)
        recorded = next(r for r in prof.rows if r.aten.endswith("::" + p.stem.split("_", 1)[1])
                        and r.shapes == ", ".join("x".join(map(str, x.shape)) for x in xs))
        direct = getattr(torch.ops.aten, recorded.aten.split("::")[1])(*xs)
        assert torch.allclose(op.torch_impl(xs)[0], direct), p.name
    # A size is one constant per extent: resizing it keeps the call consistent.
    lin = next(p for p in problems if "linear" in p.name)
    op = load_op(spec_from_problem_file(lin, overrides={"n0": 48}))
    assert op.make_inputs(0)[0].shape[0] == 48


def test_the_command_prints_the_table_and_refuses_a_file_without_inputs(model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    page = tmp_path / "profile.html"
    assert main(["profile", str(model), "--top", "4", "--iterations", "1", "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert "could save" in out and "more operator instances" in out
    html = page.read_text()
    assert 'data-figure="profile"' in html and "could save at best" in html and "module::layernorm" in html
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    assert main(["profile", str(bad)]) == 2
    assert "defines no get_inputs()" in capsys.readouterr().err


@pytest.mark.cuda
def test_on_a_gpu_rows_carry_device_time(model):
    prof = profile_model(model, "cuda", dtype="bf16", iterations=2,
                         peaks={"copy_gbps": 4000.0, "bf16_gflops": 700000.0})
    rows = {(r.aten, r.shapes): r for r in prof.rows}
    soft = rows[("aten::softmax", "32x32")]
    assert soft.calls == 3 and soft.total_s > 0 and soft.library == ("softmax", "32x32", "bf16")
    assert prof.total_s > 0 and sum(r.share for r in prof.rows) == pytest.approx(1.0)


HF_STYLE = '''import torch
import torch.nn as nn

hidden = 64
inter = 96


class RMSNorm(nn.Module):  # as transformers' Llama and Qwen2 write it
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class NoWeightNorm(RMSNorm):  # ignores its weight (ones at init): not the library's rmsnorm
    def forward(self, x):
        h = x.to(torch.float32)
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.mlp = MLP()
        self.other = NoWeightNorm(hidden)

    def forward(self, x):
        h = x + self.mlp(self.norm(x))
        return self.other(h) * 2


def get_inputs():
    return [torch.randn(2, 16, hidden)]


def get_init_inputs():
    return []
'''


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The commands run in tmp_path with a cache of its own and short timings."""
    monkeypatch.chdir(tmp_path)
    for k, v in {"CACHE_DIR": str(tmp_path / "cache"), "BENCH_BUDGET_S": "0.005", "WARMUP_S": "0",
                 "MIN_REPS": "3", "MAX_REPS": "10", "REPORT": "0"}.items():
        monkeypatch.setenv("TUNER_" + k, v)
    return tmp_path


def test_profile_sweep_patch_verify_on_the_cpu(tmp_path, in_tmp, capsys, monkeypatch):
    """The whole path a user takes from a model, through the commands: profile (an RMSNorm and
    a gated MLP written as transformers writes them are rows of the library's ops, a module
    that ignores its weight is not), emit, sweep, db update, export, verify (outputs held to
    float64, eager / compile / patched / patched + compile timed; the norm and the MLP's gate
    run the tuned C kernels)."""
    import yaml
    (tmp_path / "model.py").write_text(HF_STYLE)
    prof = profile_model(tmp_path / "model.py", "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    rows = {r.aten: r for r in prof.rows}
    assert rows["module::rmsnorm"].library == ("rmsnorm", "32x64", "fp32") and rows["module::rmsnorm"].calls == 1
    assert rows["module::swiglu"].library == ("swiglu", "32x96", "fp32")
    assert sum(r.aten == "aten::linear" for r in prof.rows) == 2  # the MLP's projections stay rows
    # NoWeightNorm's ops: not the library's rmsnorm row, but a module of the model's own, whole
    assert rows["class::NoWeightNorm(variance_epsilon=1e-06)"].library is None and "aten::rsqrt" not in rows
    # A routed module whose op has no skeleton in a backend's language is said so, not extracted.
    from tuner.cli.profile import with_skeletons
    elsewhere = emit_sweep(with_skeletons(prof, "no_such_language"), tmp_path / "elsewhere.yaml", "cpu", min_share=0.0)
    assert "the library's swiglu has no skeleton in this backend's language (it has: c, cuda, triton" in elsewhere.read_text()
    # --min-share 0: on a busy machine one profiled forward can put a row under the 1 % default
    assert main(["profile", "model.py", "--iterations", "1", "--emit", "hot.yaml", "--min-share", "0"]) == 0
    plan = yaml.safe_load((tmp_path / "hot.yaml").read_text())
    assert plan["ops"] == {"rmsnorm-fp32": {"op": "rmsnorm", "shapes": ["32x64"], "dtypes": ["fp32"]},
                           "swiglu-fp32": {"op": "swiglu", "shapes": ["32x96"], "dtypes": ["fp32"]}}
    plan["budget"] = 2
    (tmp_path / "hot.yaml").write_text(yaml.safe_dump(plan))
    assert main(["sweep", "hot.yaml", "--out", "sw"]) == 0
    assert main(["db", "update", "sw", "--db", "db.json"]) == 0
    assert main(["export", "--db", "db.json", "--out", "exp"]) == 0
    capsys.readouterr()
    # --serve-slower: at these tiny shapes torch's own may win a kernel's run (then left to torch
    # by default: tests/test_runtime.py); routing is what is checked here.
    from tuner.model import verify as verify_module
    timed_sets = []  # the input sets each timed variant cycles over
    real_cycling = verify_module.cycling
    monkeypatch.setattr(verify_module, "cycling", lambda fn, sets: (timed_sets.append(sets), real_cycling(fn, sets))[1])
    assert main(["verify", "model.py", "--db", "exp/tuning.json", "--rounds", "2", "--json", "--serve-slower"]) == 0
    v = json.loads(capsys.readouterr().out)
    # Every timed variant, each forward on inputs of its own (the warm-up's and two rounds').
    assert len(timed_sets) >= 4 and all(len({tuple(s[0].flatten()[:4].tolist()) for s in sets}) == 3 for sets in timed_sets)
    assert v["passed"] and v["error"] <= v["allowed"]
    assert [list(m) for m in v["modules"]] == [["mlp", "swiglu"], ["norm", "rmsnorm"]]
    assert ["rmsnorm 32x64 fp32", 1, 0] in [list(r) for r in v["routed"]]
    assert ["swiglu 32x96 fp32", 1, 0] in [list(r) for r in v["routed"]]
    assert {k for k, _ in v["medians_s"]} == {"eager", "torch.compile", "patched eager", "patched + torch.compile"}
    # Each routed call timed alone: its calls per forward, torch's time and the kernel's.
    ops = {o[0]: o for o in v["ops"]}
    assert set(ops) == {"rmsnorm 32x64 fp32", "swiglu 32x96 fp32"}
    assert all(o[1] == 1 and o[2] > 0 and o[3] > 0 and o[4] == o[2] - o[3] for o in ops.values())
    # Each call's floor: its bytes (inputs and outputs) at the cpu's copy rate; swiglu moves gate,
    # up and out (3 x 32x96 fp32), rmsnorm x, its weight and out (2 x 32x64 + 64 fp32).
    floors = dict(v["floors"])
    assert set(floors) == set(ops) and floors["swiglu 32x96 fp32"] / floors["rmsnorm 32x64 fp32"] == pytest.approx(
        3 * 32 * 96 / (2 * 32 * 64 + 64))
    assert main(["verify", "model.py", "--db", "exp/tuning.json", "--rounds", "1", "--no-compile", "--serve-slower"]) == 0
    out = capsys.readouterr().out
    assert "each routed call timed alone here" in out and "rmsnorm 32x64 fp32:" in out and "their sum:" in out
    assert "at most (each call's bytes at copy bandwidth, its route free): " in out
    # tuner run: the same table serves the model's forward; its outputs saved.
    assert main(["run", "model.py", "--db", "exp/tuning.json", "--iterations", "2", "--save", "out.pt", "--serve-slower",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert ["rmsnorm 32x64 fp32", 1, 0] in [list(x) for x in r["routed"]] and r["forward_s"] > 0
    import torch
    saved = torch.load(tmp_path / "out.pt")
    assert [list(t.shape) for t in saved] == [list(s) for s, _ in r["outputs"]]
    # --ops: only those ops routed (verify's advice, taken from the command line)
    assert main(["run", "model.py", "--db", "exp/tuning.json", "--iterations", "1", "--serve-slower", "--ops", "swiglu",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [x[0] for x in r["routed"]] == ["swiglu 32x96 fp32"] and [m[1] for m in r["modules"]] == ["swiglu"]
    with pytest.raises(SystemExit) as refused:  # argparse's bad usage: exit 2, the reason on stderr
        main(["run", "model.py", "--db", "exp/tuning.json", "--ops", ","])
    assert refused.value.code == 2 and "--ops: name at least one op" in capsys.readouterr().err
    assert main(["verify", "model.py", "--db", "exp/tuning.json", "--ops", "rmsnorm,rmsnrom"]) == 2
    assert "error: --ops: rmsnrom is not an op the patch routes; one of " in capsys.readouterr().err



ROPE_MODEL = '''import torch
import torch.nn as nn


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # as transformers writes it
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(64, 64), nn.Linear(64, 32)

    def forward(self, x):
        b, s, _ = x.shape
        theta = torch.arange(s, dtype=x.dtype)[:, None] * torch.linspace(0.1, 1.0, 8)
        cos = torch.cat([theta.cos()] * 2, -1)[None].expand(b, s, 16)
        sin = torch.cat([theta.sin()] * 2, -1)[None].expand(b, s, 16)
        q = self.q_proj(x).view(b, s, 4, 16).transpose(1, 2)
        k = self.k_proj(x).view(b, s, 2, 16).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q.sum() + k.sum()


def get_inputs():
    return [torch.randn(2, 6, 64)]


def get_init_inputs():
    return []
'''


def test_a_models_rope_function_is_a_row_of_two_rope_calls(tmp_path):
    """The model's own apply_rotary_pos_emb (the patch's function route) is one row,
    module::rope, its aten ops absorbed, and the emitted sweep tunes rope at q's and at k's
    token shapes (12x4x16 and 12x2x16); the function is the model's own again afterwards."""
    import sys

    from tuner.sweeps.plan import load_plan
    (tmp_path / "rope_model.py").write_text(ROPE_MODEL)
    prof = profile_model(tmp_path / "rope_model.py", "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    rope = [r for r in prof.rows if r.aten == "module::rope"]
    assert len(rope) == 1 and rope[0].calls == 1, [r.aten for r in prof.rows]
    assert rope[0].shapes == "12x4x16, 12x2x16, 12x8, 12x8" and rope[0].library == ("rope", "12x4x16", "fp32")
    assert not any(r.aten == "aten::neg" for r in prof.rows)  # rotate_half's, inside the function: its row
    tasks = {(t.op, t.shape) for t in load_plan(emit_sweep(prof, tmp_path / "hot.yaml", "cpu", min_share=0.0)).tasks}
    assert {("rope", "12x4x16"), ("rope", "12x2x16")} <= tasks
    mod = next(m for m in sys.modules.values() if getattr(m, "__file__", None) == str(tmp_path / "rope_model.py"))
    assert not hasattr(mod.apply_rotary_pos_emb, "__wrapped__")


DECODE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):  # one decode step of grouped-query attention, as transformers calls SDPA
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(64, 64)
        self.register_buffer("k", torch.randn(2, 2, 40, 16))
        self.register_buffer("v", torch.randn(2, 2, 40, 16))

    def forward(self, x):
        q = self.q_proj(x).view(2, 1, 4, 16).transpose(1, 2)
        causal = F.scaled_dot_product_attention(q, self.k[:, :, :1], self.v[:, :, :1], is_causal=True,
                                                enable_gqa=True)
        o = F.scaled_dot_product_attention(q, self.k, self.v, scale=16 ** -0.5, enable_gqa=True)
        return (o + causal).transpose(1, 2).reshape(2, 1, 64)


def get_inputs():
    return [torch.randn(2, 1, 64)]


def get_init_inputs():
    return []
'''


def test_sdpa_at_a_decode_step_is_the_librarys_attention_decode(tmp_path):
    """One query per sequence against a grouped KV cache (no mask, not causal, scale 1/sqrt(D)):
    the row is attention_decode at B x H x KH x S x D and the emitted sweep tunes it; a causal
    call is not the op (SDPA's causal mask on one query keeps key 0 alone)."""
    from tuner.sweeps.plan import load_plan
    (tmp_path / "decode.py").write_text(DECODE)
    prof = profile_model(tmp_path / "decode.py", "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    sdpa = {r.shapes: r for r in prof.rows if r.aten == "aten::scaled_dot_product_attention"}
    assert sdpa["2x4x1x16, 2x2x40x16, 2x2x40x16"].library == ("attention_decode", "2x4x2x40x16", "fp32")
    assert sdpa["2x4x1x16, 2x2x1x16, 2x2x1x16"].library is None
    tasks = {(t.op, t.shape) for t in load_plan(emit_sweep(prof, tmp_path / "hot.yaml", "cpu", min_share=0.0)).tasks}
    assert ("attention_decode", "2x4x2x40x16") in tasks


OWN_MODULE = '''import torch
import torch.nn as nn


class TanhGELU(nn.Module):
    """GPT-2's GELU written out: several elementwise ops, one kernel's work."""
    def __init__(self, c=0.044715):
        super().__init__()
        self.c = c

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + self.c * x * x * x)))


class EpsNorm(nn.Module):
    """An RMSNorm at eps 1e-5 (the library's rmsnorm is at 1e-6): a leaf with a weight."""
    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.act = TanhGELU()
        self.other = TanhGELU(0.05)
        self.again = TanhGELU()
        self.relu = nn.ReLU()
        self.norm = EpsNorm(128)
        self.narrow = EpsNorm(64)

    def forward(self, x):
        h = self.up(x)
        return self.norm(self.relu(self.act(h)) + self.other(h) + self.again(h)) + self.narrow(x).sum()


def get_inputs():
    return [torch.randn(32, 64)]


def get_init_inputs():
    return []
'''

NORM_C = '''#include <stddef.h>
#include <math.h>
void tuner_kernel(const {{ ctype }} *in0, const {{ ctype }} *w, {{ ctype }} *out0) {
    #pragma omp parallel for num_threads({{ THREADS }})
    for (size_t r = 0; r < {{ n0 }}; r++) {
        const {{ ctype }} *x = in0 + r * {{ n1 }};
        double s = 0;
        for (size_t i = 0; i < {{ n1 }}; i++) s += (double)x[i] * x[i];
        float inv = 1.0f / sqrtf((float)(s / {{ n1 }}) + 1e-5f);
        for (size_t i = 0; i < {{ n1 }}; i++) out0[r * {{ n1 }} + i] = w[i] * (x[i] * inv);
    }
}
'''

GELU_C = '''#include <stddef.h>
#include <math.h>
void tuner_kernel(const {{ ctype }} *in0, {{ ctype }} *out0) {
    const size_t n = (size_t){{ n0 }} * {{ n1 }};
    #pragma omp parallel for num_threads({{ THREADS }}) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = in0[i];
        out0[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
}
'''


def _tune_and_export(problem, template: str, threads: list[int]) -> None:
    """`problem` tuned with a C skeleton (one config per THREADS value), into exp/tuning.json."""
    Path("k.c.j2").write_text(template)
    Path("k.yaml").write_text(f"language: c\nsizes: [n0, n1]\nparams:\n  THREADS: {threads}\n")
    assert main(["tune", "--op", str(problem), "--template", "k.c.j2", "--space", "k.yaml",
                 "--budget", str(len(threads)), "--runs-dir", "runs"]) == 0
    assert main(["db", "update", "runs", "--db", "db.json"]) == 0
    assert main(["export", "--db", "db.json", "--out", "exp"]) == 0


@pytest.fixture
def no_grad_after():
    yield
    torch.set_grad_enabled(True)


def test_a_models_own_module_is_extracted_whole_tuned_and_put_back(tmp_path, in_tmp, no_grad_after):
    """A leaf module without parameters whose forward runs several aten ops is one profile row
    ("class::" its name and attributes; the same class with other attributes another row; a
    one-op module stays its aten op's row), extracted as a problem file whose Model is the
    module made again (`MODULE`), tuned like any problem file, and put back by `runtime.patch`
    in place of every module with that recipe, only that one; reversible."""
    from tuner import runtime
    from tuner.core.ops import load_op
    from tuner.core.problem import spec_from_problem_file
    from tuner.model.profile import load_model
    from tuner.serve.extracted import read
    (tmp_path / "model.py").write_text(OWN_MODULE)
    prof = profile_model(tmp_path / "model.py", "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    rows = {r.aten: r for r in prof.rows}
    assert rows["class::TanhGELU(c=0.044715)"].calls == 2 and rows["class::TanhGELU(c=0.044715)"].shapes == "32x128"
    assert rows["class::TanhGELU(c=0.05)"].calls == 1
    assert "aten::relu" in rows and "aten::tanh" not in rows and "aten::linear" in rows
    emit_sweep(prof, tmp_path / "hot.yaml", "cpu", top=20, min_share=0.0)
    assert len(list((tmp_path / "hot_problems").glob("*TanhGELU*.py"))) == 2  # act and again: one op
    problem = next(p for p in (tmp_path / "hot_problems").glob("*TanhGELU.py") if read(p)["attrs"]["c"] == 0.044715)
    assert "#       def forward(self, x):" in problem.read_text()  # the class's source, for whoever writes the kernel
    model, (x,) = load_model(tmp_path / "model.py")
    model.eval()  # as profiled (a module in training mode runs its own forward: below)
    op = load_op(spec_from_problem_file(problem))
    xs = op.make_inputs(1)
    assert torch.equal(op.torch_impl(xs)[0], model.act(xs[0]))  # the Model is the module
    _tune_and_export(problem, GELU_C, [1, 2])
    table = runtime.load("exp/tuning.json", serve_slower=True)  # routing is what is checked, not the speed
    torch.set_grad_enabled(False)  # a call autograd records is torch's own (set back by the fixture below)
    ref = model(x)
    runtime.patch(model, table)
    p = model.tuner_patch
    assert p.modules == {"act": problem.stem, "again": problem.stem}  # `other` (c=0.05) is another op
    assert torch.allclose(model(x), ref, atol=1e-5, rtol=1e-5)
    assert dict(p.stats) == {f"{problem.stem} 32x128 fp32": [2, 0]}
    h = torch.randn(32, 128)
    assert torch.allclose(model.act(x=h), 0.5 * h * (1 + torch.tanh(0.7978845608 * (h + 0.044715 * h ** 3))), atol=1e-6)
    assert dict(p.stats) == {f"{problem.stem} 32x128 fp32": [2, 0]}  # a keyword call: the module's own
    p.torch_of(problem.stem)(h)  # torch's definition, for verify's timing: the module's own forward
    assert dict(p.stats) == {f"{problem.stem} 32x128 fp32": [2, 0]}
    model.train()  # the file was profiled and tuned in eval mode
    model.act(h)
    assert dict(p.stats) == {f"{problem.stem} 32x128 fp32": [2, 0]}
    model.eval()
    h = torch.randn(16, 128)  # other sizes: the runtime's rule (the nearest tuned config, checked here)
    assert torch.allclose(model.act(h), model.other.__class__(0.044715)(h), atol=1e-5)
    assert p.stats[f"{problem.stem} 16x128 fp32"] == [1, 0]
    runtime.unpatch(model)
    assert "forward" not in model.act.__dict__ and torch.allclose(model(x), ref)
    with pytest.raises(ValueError, match="extracted whole; under torch.compile its own forward"):
        runtime.patch(model, table, under_compile={problem.stem})  # would be accepted, then ignored
    assert runtime.patch(model, table, ops={problem.stem}).tuner_patch.modules  # routed in eager: fine
    runtime.unpatch(model)
    # A problem file whose MODULE names the module but whose Model computes something else (a
    # file is only text): the probe leaves the module alone, and says why.
    import shutil
    shutil.copytree(tmp_path / "exp", tmp_path / "exp2")
    copy = next((tmp_path / "exp2" / "problems").glob("*.py"))
    copy.write_text(copy.read_text().replace("return self.module(in0)", "return self.module(in0) * 1.001"))
    runtime.patch(model, runtime.load("exp2/tuning.json", serve_slower=True))
    assert model.tuner_patch.modules == {} and "does not compute what the module does" in model.tuner_patch.refused[problem.stem]
    runtime.unpatch(model)


def test_verify_says_patched_compile_is_slower_only_where_a_call_is_routed_under_compile():
    """A module extracted whole is the compiler's under torch.compile (its own forward is
    traced): a slower patched + compile there is the machine's, not advice."""
    from tuner.model.advice import slower
    medians = {"eager": 1.0, "patched eager": 0.8, "torch.compile": 1.0, "patched + torch.compile": 1.1}
    assert [n.split(" is")[0] for n in slower(medians)] == ["patched + torch.compile"]
    assert slower(medians, compiled=False) == []


def test_a_leaf_module_with_a_weight_is_extracted_and_runs_with_the_models_own_weight(tmp_path, in_tmp,
                                                                                     no_grad_after):
    """A leaf with a parameter (an RMSNorm at an eps the library's op does not have): its
    problem file's Model draws the weight at the shape the module had (a size constant); the
    patched module's kernel is passed the model's own weight, not the Model's. Two widths of
    one recipe are two problem files, and each module runs the kernel of its own."""
    from tuner import runtime
    from tuner.model.profile import load_model
    (tmp_path / "model.py").write_text(OWN_MODULE)
    prof = profile_model(tmp_path / "model.py", "cpu", iterations=1, peaks={"copy_gbps": 10.0, "fp32_gflops": 100.0})
    row = next(r for r in prof.rows if r.aten == "class::EpsNorm(eps=1e-05)")
    assert row.calls == 1 and row.shapes == "32x128" and "aten::rsqrt" not in {r.aten for r in prof.rows}
    assert row.bytes == 4 * (32 * 128 + 32 * 128 + 128)  # its input, its output (on meta tensors), its weight
    emit_sweep(prof, tmp_path / "hot.yaml", "cpu", top=20, min_share=0.0)
    norms = {p.read_text().split("n1 = ", 1)[1].split("\n", 1)[0]: p for p in (tmp_path / "hot_problems").glob("*EpsNorm.py")}
    problem, narrow = norms["128"], norms["64"]  # the same recipe, weights of two widths: two files
    assert "build(MODULE, {'weight': (n1,)})" in problem.read_text()
    # A kernel that ignores the weight it is given (the Model's are drawn near 1, not 1) fails.
    Path("bad.c.j2").write_text(NORM_C.replace("w[i] * (x[i] * inv)", "(x[i] * inv)"))
    Path("k.yaml").write_text("language: c\nsizes: [n0, n1]\nparams:\n  THREADS: [1]\n")
    assert main(["tune", "--op", str(problem), "--template", "bad.c.j2", "--space", "k.yaml", "--budget", "1",
                 "--runs-dir", "bad_runs"]) == NO_WINNER
    summary = json.loads(next(Path("bad_runs").glob("*/summary.json")).read_text())
    assert summary["best"] is None and "WRONG_RESULT" in summary["failures"]
    _tune_and_export(problem, NORM_C, [1])
    _tune_and_export(narrow, NORM_C, [1])
    model, (x,) = load_model(tmp_path / "model.py")
    model.eval()
    torch.set_grad_enabled(False)
    model.norm.weight.copy_(torch.randn(128))  # the model's own: the kernel must be given these
    model.narrow.weight.copy_(torch.randn(64))
    ref = model(x)
    runtime.patch(model, runtime.load("exp/tuning.json", serve_slower=True))
    # each module gets the op of its own width (the other's probe does not agree)
    assert model.tuner_patch.modules == {"norm": problem.stem, "narrow": narrow.stem}, model.tuner_patch.refused
    assert model.tuner_patch.refused == {}
    assert torch.allclose(model(x), ref, atol=1e-4, rtol=1e-5)
    assert dict(model.tuner_patch.stats) == {f"{problem.stem} 32x128 fp32": [1, 0], f"{narrow.stem} 32x64 fp32": [1, 0]}
    runtime.unpatch(model)


@pytest.mark.parametrize("text", ["MODULE = " + "[" * 200000 + "]" * 200000, "MODULE = 10 ** 10 ** 10",
                                  "MODULE = __import__('os').system('false')", "MODULE = {'class': 1}", "x = (",
                                  "MODULE = {'class': 'a:B', 'attrs': {}}\nMODULE = 3"])
def test_a_problem_files_module_is_read_as_a_literal_only(tmp_path, text):
    """`MODULE` is read without running the file: nesting built to exhaust the parser, an
    expression built to run for ever, a call, a wrong shape: none of it runs, each reads as
    no recipe, at once (the first MODULE of a file counts)."""
    import time

    from tuner.serve.extracted import read
    p = tmp_path / "p.py"
    p.write_text(text)
    t0 = time.perf_counter()
    r = read(p)
    assert time.perf_counter() - t0 < 1.0
    assert r == ({"class": "a:B", "attrs": {}} if text.endswith("= 3") else None)


def test_verify_times_each_forward_on_inputs_no_call_before_it_had():
    """`tuner verify`'s timed forwards: a served kernel that kept its results keyed by its
    inputs (honest while it was tuned, a count of its calls telling it when to start) would
    answer every timed forward from the first if each took the same inputs. Floating-point
    inputs are rotated per call (the same values, dtype, shape); token ids and masks kept."""
    import torch

    from tuner.model.verify import cycling, timing_sets
    x = torch.randn(4, 300, dtype=torch.bfloat16)
    ids = torch.arange(12).view(3, 4)
    sets = timing_sets([x, ids, 7], 21)
    assert len(sets) == 21
    assert len({tuple(s[0].flatten()[:8].tolist()) for s in sets}) == 21  # every forward its own
    for s in sets:
        assert s[0].shape == x.shape and s[0].dtype == x.dtype
        assert torch.equal(s[0].flatten().sort().values, x.flatten().sort().values)
        assert s[1] is ids and s[2] == 7
    seen = []
    call = cycling(lambda a, b, c: seen.append(a), sets)
    for _ in range(22):
        call()
    assert seen[:21] == [s[0] for s in sets] and seen[21] is sets[0][0]
