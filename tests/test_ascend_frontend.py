"""triton-ascend's real front end and adapter, on a machine with neither NPU nor CANN.

Needs an interpreter with triton-ascend (TUNER_ASCEND_PYTHON, or this one when its triton is
triton-ascend): CI makes one (.ci/run). Without it these tests are skipped, and the sim backend
says that it checked statically only."""

import json
import random

import pytest

from tests.llm_server import ScriptedServer
from tests.test_proposer_loop import env, only_run  # noqa: F401 - env is a fixture
from tuner.backends.ascend_frontend import AscendFrontend
from tuner.backends.sim import SimBackend
from tuner.cli.main import main
from tuner.core.ops import builtin_spec, load_op, render_context
from tuner.core.skeleton import library_skeleton, library_skeletons
from tuner.core.values import Config, Status

needs_frontend = pytest.mark.skipif(AscendFrontend.find() is None,
                                    reason=f"no triton-ascend: {AscendFrontend.why_not()}")

SHAPES = {"softmax": ("4096x4096", "1024x8192"), "rmsnorm": ("4096x4096", "2048x6144"),
          "layernorm": ("4096x4096", "2048x6144"), "add_rmsnorm": ("4096x4096", "2048x6144"),
          "swiglu": ("4096x4096", "2048x11008"), "rope": ("4096x32x128", "1024x8x64"),
          "matmul": ("1024x1024x1024", "512x2048x256")}


def covering(space, check, rng: random.Random, tries: int = 200) -> list[Config]:
    """Valid configs in which every value of every param appears (as far as the constraints
    allow), the default first."""
    out = {space.default_config().key: space.default_config()}
    for p in space.params:
        for v in p.values:
            if any(c.as_dict()[p.name] == v for c in out.values()):
                continue
            for _ in range(tries):
                c = Config.of({**{q.name: rng.choice(q.values) for q in space.params}, p.name: v})
                if check(c) is None:
                    out[c.key] = c
                    break
    return [c for c in out.values() if check(c) is None]


@needs_frontend
@pytest.mark.parametrize("op_name", sorted(o for o, langs in library_skeletons().items() if "triton_ascend" in langs))
def test_every_library_skeleton_passes_the_real_front_end_and_adapter(op_name, tmp_path):
    """Every value of every param, at two shapes and three dtypes, through triton-ascend's own
    compiler up to bishengir; the adapter's kernel kind is recorded and agrees with the
    template's (a tl.dot kernel is 'mix' at every dtype)."""
    sk = library_skeleton(op_name, "triton_ascend")
    failures, n = [], 0
    for shape in SHAPES[op_name]:
        for dtype in ("fp32", "bf16", "fp16"):
            spec = builtin_spec(op_name, shape, dtype)
            sim = SimBackend(0, chip="910B2", op=spec.to_json(), verify="reference")
            op = load_op(spec)
            ctx = {**render_context(op), **sim.render_context(op)}
            for c in covering(sk.space, lambda c: sk.space.check(c, ctx, sim.limits()), random.Random(0)):
                n += 1
                build = sim.compile(sk.render(c, ctx), spec, str(tmp_path / f"{n}"), 120)
                if build.status is not Status.OK:
                    failures.append(f"{shape} {dtype} {c}: {build.error[:400]}")
                    continue
                real = json.loads(open(build.artifact).read())["compiled_by"]
                assert real["status"] == "ok" and real["kernels"], real
                kinds = {k["mix_mode"] for k in real["kernels"]}
                assert kinds <= {"aiv", "aic", "mix"}, kinds
                if op_name == "matmul":
                    assert kinds == {"mix"}, (dtype, kinds)
    assert n > 0 and not failures, "\n".join(failures[:10])


@needs_frontend
def test_the_real_compilers_error_is_a_compile_error_with_its_message(tmp_path):
    spec = builtin_spec("softmax", "1024x1024", "fp32")
    sim = SimBackend(0, chip="910B2", op=spec.to_json(), verify="reference")
    sk = library_skeleton("softmax", "triton_ascend")
    op = load_op(spec)
    ctx = {**render_context(op), **sim.render_context(op)}
    src = sk.render(sk.space.default_config(), ctx)
    # fp8 is not a type the Ascend back end knows: its front end says so.
    lines = src.splitlines()
    i = next(k for k, ln in enumerate(lines) if "tl.load(" in ln and "=" in ln.split("tl.load(")[0])
    var = lines[i].split("=")[0].strip()
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    lines.insert(i + 1, f"{indent}{var} = {var}.to(tl.float8e4nv).to(tl.float32)")
    build = sim.compile("\n".join(lines) + "\n", spec, str(tmp_path / "bad"), 120)
    assert build.status is Status.COMPILE_ERROR
    assert build.error.startswith("triton-ascend 3.2") and "unexpected type fp8" in build.error


@needs_frontend
def test_a_models_ascend_invalid_skeleton_gets_the_real_compilers_message(env):  # noqa: F811
    """The model's first reply compiles in Triton but not for Ascend (fp8); the repair request
    carries triton-ascend's own message, and the fixed reply is searched."""
    sk = library_skeleton("softmax", "triton_ascend")
    yaml_text = open(sk.space.source).read()
    template = sk.template
    anchor = next(ln for ln in template.splitlines() if "tl.load(" in ln and "=" in ln.split("tl.load(")[0])
    var = anchor.split("=")[0].strip()
    indent = anchor[:len(anchor) - len(anchor.lstrip())]
    broken = template.replace(anchor, anchor + f"\n{indent}{var} = {var}.to(tl.float8e4nv).to(tl.float32)", 1)

    def reply(t):
        return f"```yaml\n{yaml_text}\n```\n```jinja\n{t}\n```\n"
    runs = env / "runs"
    with ScriptedServer([{"reply": reply(broken)}, {"reply": reply(template)}]) as srv:
        rc = main(["tune", "softmax", "--shape", "8x1024", "--dtype", "fp32", "--backend", "sim",
                   "--llm", "coder", "--llm-base-url", srv.base_url, "--rounds", "1", "--budget", "1",
                   "--validate-configs", "0", "--runs-dir", str(runs), "--quiet"])
        reqs = srv.chat_requests()
    assert len(reqs) >= 2
    assert rc == 0 and len(reqs) == 2, reqs[-1]["json"]["messages"][-1]["content"][:1500]
    repair = reqs[1]["json"]["messages"][-1]["content"]
    assert "compile error" in repair and "triton-ascend 3.2" in repair and "unexpected type fp8" in repair
    summary = json.loads((only_run(runs) / "summary.json").read_text())
    assert "front end and adapter (real)" in dict(summary["device"]["toolchain"])["compile"]
