"""The prompts a model proposer sends: built from versioned text files in `tuner/llm/prompts/`.

`tuner/prompts/<version>/` holds Jinja2 texts: `system.md`, `propose.md` (round 1),
`revise.md` (later rounds, with the last round's feedback), `repair.md` (a rejected reply),
`op.md`, `format.md`, and `backend_<name>.md` (each backend's rules). A run records the
version and a hash of the texts; `--llm-prompts DIR` points at an edited copy.

What goes in: the op's reference (a built-in's formula, or a problem file's source), its
inputs, outputs, sizes, dtype and tolerance; the device profile (cores, limits, measured
peaks, the reference's time); the backend's rules and the kernel entry it calls; the
skeleton format; one worked example from the library.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from tuner.core.ops import BUILTINS, Op, arg_specs, c_entry, dtype_label
from tuner.core.skeleton import Skeleton, data_dir, library_skeleton, library_skeletons
from tuner.core.values import DeviceInfo, OpSpec

PROMPT_VERSION = "v1"
MAX_SOURCE_CHARS = 12000


def prompts_dir(override: str | Path | None = None) -> Path:
    path = Path(override) if override else Path(__file__).resolve().parent / "prompts" / PROMPT_VERSION
    if not (path / "system.md").is_file():
        raise FileNotFoundError(f"{path} holds no prompt texts (system.md, propose.md, ...)")
    return path


def prompts_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.glob("*.md")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# A backend's rules for a language other than its default one.
RULES = {("cuda", "cuda"): "backend_cuda_cpp.md"}


@dataclass
class PromptKit:
    """Everything a prompt says about the op, device and backend, gathered once per run."""

    spec: OpSpec
    op: Op
    backend: str
    language: str
    device: DeviceInfo
    context: dict[str, Any]  # the template render context (sizes, DTYPE_BYTES, ctype, CORES...)
    limits: dict[str, float]
    reference_s: float | None = None
    budget: int = 40
    directory: str | None = None

    @property
    def dir(self) -> Path:
        return prompts_dir(self.directory)

    def _env(self) -> jinja2.Environment:
        return jinja2.Environment(loader=jinja2.FileSystemLoader(str(self.dir)),
                                  undefined=jinja2.StrictUndefined, trim_blocks=True,
                                  lstrip_blocks=True, autoescape=False)

    def render(self, name: str, **values: Any) -> str:
        text = self._env().get_template(name).render(**values).strip()
        return re.sub(r"\n{3,}", "\n\n", text) + "\n"

    # ---- the facts -------------------------------------------------------------------------

    def entry(self) -> str:
        names_in, names_out = self.op.input_names, self.op.output_names
        if self.language == "c":
            return c_entry(self.op, self.context.get("ctype", "float"))
        if self.language in ("triton", "triton_ascend", "cuda"):
            return f"def launch({', '.join(names_in + names_out)})"
        return "(none: the null device runs the reference itself)"

    def facts(self) -> dict[str, Any]:
        spec, op = self.spec, self.op
        if spec.kind == "builtin":
            reference = f"Reference: {BUILTINS[spec.name].doc}."
            try:
                code = textwrap.dedent(inspect.getsource(op.reference)).strip()
                code = re.sub(r"\s*# noqa.*$", "", code, flags=re.M)
                reference += f" In torch (float64):\n\n```python\n{code}\n```"
            except (OSError, TypeError):
                pass
        else:
            try:
                text = Path(spec.source).read_text()[:MAX_SOURCE_CHARS]
            except OSError:
                text = "(the problem file is unreadable)"
            overrides = ", ".join(f"{k}={v}" for k, v in spec.sizes)
            reference = (f"Reference: a KernelBench-format problem (`Model.forward`); its "
                         f"module-level sizes are set to {overrides}. The kernel's inputs are "
                         f"`get_inputs()` followed by the model's parameters and buffers. The "
                         f"template and expressions can also name each input's and output's "
                         f"extents as `<name>_dim<k>` (e.g. in0_dim1: dim 1 of in0).\n\n"
                         f"```python\n{text.rstrip()}\n```")
        ins, outs = arg_specs(op)
        inputs = ", ".join(f"{n} {list(shape)} {dtype_label(dt, spec.dtype)}"
                           for n, (shape, dt) in zip(op.input_names, ins))
        outputs = ", ".join(f"{n} {list(shape)} {dtype_label(dt, spec.dtype)}"
                            for n, (shape, dt) in zip(op.output_names, outs))
        work = f"{op.bytes / 1e6:.3g} MB moved at least"
        if op.flops:
            work += f", {op.flops / 1e6:.3g} MFLOP"
        return {"op_name": spec.name, "reference": reference, "inputs": inputs, "outputs": outputs,
                "sizes": ", ".join(f"{k}={v}" for k, v in spec.sizes) or "(none)",
                "dtype": spec.dtype, "atol": f"{op.tolerance[0]:g}", "rtol": f"{op.tolerance[1]:g}",
                "work": work, "device": self.device_text(),
                "reference_s": _fmt_s(self.reference_s) if self.reference_s else "",
                "backend": self.backend, "backend_rules": self.backend_rules(), "format": self.format(),
                "budget": self.budget}

    def device_text(self) -> str:
        d = self.device
        lines = [f"- {d.name}{' (simulated)' if d.simulated else ''}, backend {d.backend}, "
                 f"{d.cores} cores (CORES={self.context.get('CORES', d.cores)} in expressions"
                 + (f", ARCH={self.context['ARCH']}: the compute capability" if "ARCH" in self.context else "")
                 + ")"]
        if d.limits:
            lines.append("- Limits: " + ", ".join(f"{k} = {v:g}" for k, v in d.limits))
        if d.peaks:
            lines.append("- Measured peaks: " + ", ".join(f"{k} = {v:g}" for k, v in d.peaks))
        if d.toolchain:
            lines.append("- Toolchain: " + ", ".join(f"{k} {v}" for k, v in d.toolchain))
        return "\n".join(lines)

    def backend_rules(self) -> str:
        name = "npu" if self.backend in ("npu", "sim") else self.backend
        path = self.dir / RULES.get((name, self.language), f"backend_{name}.md")
        if not path.is_file():
            return f"(no rules written for the {self.backend} backend; the kernel entry is {self.entry()})"
        from tuner.backends.ascend_model import COST_KEYS  # (no heavy imports)
        return self.render(path.name, entry=self.entry(), limits=self._limits_text(),
                           ctype=self.context.get("ctype", ""), simulated=self.backend == "sim",
                           cost_keys=list(COST_KEYS.items()))

    def _limits_text(self) -> str:
        return ", ".join(f"{k} <= {v:g}" for k, v in self.limits.items())

    def format(self) -> str:
        ctx = ", ".join(f"{k} (= {v!r})" for k, v in sorted(self.context.items()))
        return self.render("format.md", language=self.language, size_names=[k for k, _ in self.spec.sizes],
                           limits=self._limits_text(), context_names=ctx)

    def example(self) -> dict[str, Any] | None:
        """The library skeleton of the same op and language, else the shortest one in it."""
        have = [op for op, langs in library_skeletons().items() if self.language in langs]
        if not have:
            return None
        same = self.spec.kind == "builtin" and self.spec.name in have
        name = self.spec.name if same else min(
            have, key=lambda o: len(library_skeleton(o, self.language).template))
        sk = library_skeleton(name, self.language)
        return {"name": sk.name, "same_op": same, "space": space_yaml(sk).strip(),
                "template": sk.template.strip()}

    # ---- messages --------------------------------------------------------------------------

    def system(self) -> dict[str, str]:
        return {"role": "system", "content": self.render("system.md", budget=self.budget)}

    def propose(self) -> list[dict[str, str]]:
        user = self.render("propose.md", **self.facts(), example=self.example())
        return [self.system(), {"role": "user", "content": user}]

    def revise(self, skeleton: Skeleton, space_text: str, feedback_text: str, round: int) -> list[dict[str, str]]:
        user = self.render("revise.md", **self.facts(), round=round, space=space_text.strip(),
                           template=skeleton.template.strip(), feedback=feedback_text.strip())
        return [self.system(), {"role": "user", "content": user}]

    def repair(self, kind: str, message: str, line: int = 0, text: str = "", where: str = "",
               config: dict | None = None, attempt: int = 1, attempts: int = 1,
               template_line: int = 0, template_text: str = "") -> dict[str, str]:
        cfg = " ".join(f"{k}={v}" for k, v in config.items()) if config else ""
        return {"role": "user", "content": self.render(
            "repair.md", kind=kind, message=message.strip(), line=line, text=text.rstrip(),
            where=where, config=cfg, attempt=attempt, attempts=attempts,
            template_line=template_line, template_text=template_text.rstrip())}


def space_yaml(skeleton: Skeleton) -> str:
    """The space as YAML: the file it came from when there is one, else rebuilt from JSON."""
    src = skeleton.space.source
    if src and src.endswith((".yaml", ".yml")) and Path(src).is_file():
        return Path(src).read_text()
    for candidate in (data_dir("spaces") / f"{skeleton.name}.yaml",) if skeleton.name else ():
        if candidate.is_file():
            return candidate.read_text()
    sp = skeleton.space
    doc: dict[str, Any] = {"language": skeleton.language}
    if sp.sizes:
        doc["sizes"] = list(sp.sizes)
    doc["params"] = {p.name: list(p.values) for p in sp.params}
    if sp.constraints:
        doc["constraints"] = [r.expr.text for r in sp.constraints]
    if sp.resources:
        doc["resources"] = {n: r.expr.text for n, r in sp.resources}
    if sp.default:
        doc["default"] = dict(sp.default)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.4g} ms" if s >= 1e-4 else f"{s * 1e6:.4g} us"


__all__ = ["PromptKit", "PROMPT_VERSION", "prompts_dir", "prompts_hash", "space_yaml"]
