"""KernelBench-format problem files as ops: a module with `class Model`, `get_inputs()` and
`get_init_inputs()`, its module-level integer constants the sizes (overridable). The reference
is `Model.forward` in float64; the kernel receives the inputs, then the Model's parameters and
buffers, which each verification set draws anew around their values at init (`redrawn`): a
kernel that ignores a weight that happens to be all ones at init fails.

The file is imported in a bounded time (a file that loops at import is refused), in a child
process first (one that kills or ends the process at import is refused), and every way
it can fail (no Model, a Model that cannot run its own inputs, a non-tensor input) is an
`OpError` that says what to fix.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from tuner.core.op import DTYPE_BYTES, DTYPES, TOLERANCE, Op, OpError, torch_dtype
from tuner.core.values import OpSpec

IMPORT_TIMEOUT_S = 120.0  # a problem file that takes longer to import is refused
# Set in the tool's worker processes: they load only ops that the process that started them
# has loaded and checked, so the check that the Model is deterministic (a second float64
# forward on the host, seconds at 8192x8192) is not run again in each.
CHECKED_ELSEWHERE = False
# Cleared where nothing reads an op's FLOP count (the memory checker's process): torch's FLOP
# counter imports torch._dynamo, 3-5 s of a process that otherwise only checks one kernel.
COUNT_FLOPS = True


@contextlib.contextmanager
def _time_limit(seconds: float, message: str):
    """Raise OpError(message) when the body runs longer than `seconds` (main thread, POSIX;
    elsewhere no limit): a user's problem file that loops at import must not hang the tool."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise OpError(message)
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# Run in a child Python before the file is imported here: a file that ends the process at
# import (os._exit, a crash in native code) would otherwise take the tool with it, silently.
_PROBE = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("tuner_import_probe", sys.argv[1])
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
    said = "tuner-import-ok"
except BaseException:  # the import in the tool itself reports the exception
    said = "tuner-import-raised"
sys.stdout.write("\\n" + said + "\\n")
sys.stdout.flush()
os._exit(0)  # threads the file started must not keep the probe alive
"""


def probe_import(path: Path) -> None:
    """Import the file in a child process first; raise OpError if that hangs, is killed or
    ends without finishing the import (an exception there is left to the import here, which
    reports it with its traceback)."""
    import signal
    import subprocess
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True,
                              timeout=IMPORT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise OpError(f"{path}: importing it took more than {IMPORT_TIMEOUT_S:g} s "
                      f"(does it loop or wait at import?)") from None
    except OSError as e:  # no child process to be had: the in-process import still runs
        print(f"note: could not check {path} in a child process first ({e})", file=sys.stderr)
        return
    last = done.stdout.decode(errors="replace").rstrip().rsplit("\n", 1)[-1]
    if last in ("tuner-import-ok", "tuner-import-raised"):
        return
    tail = done.stderr.decode(errors="replace").strip()[-600:]
    if done.returncode < 0:
        try:
            how = f"killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"killed by signal {-done.returncode}"
        raise OpError(f"{path}: importing it {how} (a crash in native code at import?)"
                      + (f":\n{tail}" if tail else ""))
    raise OpError(f"{path}: importing it ended the process (exit status {done.returncode}) before the "
                  f"import finished: does it call os._exit or exit at import?"
                  + (f"\n{tail}" if tail else ""))


def _import_problem(path: Path, overrides: dict[str, int]):
    """Import a problem file under a private module name, then apply size overrides."""
    if not path.is_file():  # a run, a sweep or an exported table names a file moved since
        raise OpError(f"problem file {path} does not exist (moved or deleted since it was tuned?); "
                      f"its Model is the op's reference: put it back at that path")
    name = "tuner_problem_" + re.sub(r"\W", "_", path.stem) + f"_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise OpError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    code, computed = _with_sizes(path, overrides) if overrides else (None, {})
    try:
        with _time_limit(IMPORT_TIMEOUT_S, f"{path}: importing it took more than "
                         f"{IMPORT_TIMEOUT_S:g} s (does it loop or wait at import?)"):
            if code is None:
                spec.loader.exec_module(module)
            else:
                exec(code, module.__dict__)  # noqa: S102 - the user's own problem file
    except OpError:
        raise
    except BaseException as e:  # a user file may raise anything, SystemExit included
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        excerpt = "".join(tb[-4:]).strip()
        raise OpError(f"{path}: failed to import:\n{excerpt}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise OpError(f"{path}: a KernelBench-format problem defines class Model(nn.Module), "
                          f"get_inputs() and get_init_inputs(); {attr} is missing")
    sizes = _module_sizes(module)
    for k, v in overrides.items():
        if sizes.get(k) == v:
            continue
        if k not in sizes:
            raise OpError(f"{path}: no module-level integer {k!r} to override; "
                          f"it has {', '.join(sorted(sizes)) or 'none'}")
        if k in computed:
            line, text = computed[k]
            raise OpError(f"{path}:{line}: {k} is set by `{text}`, not as a number of its own, so "
                          f"--size {k}={v} cannot set it: override the sizes it comes from, or write "
                          f"it as `{k} = <number>` in one place")
        raise OpError(f"{path}: {k} is {sizes[k]} after the import, not the {v} asked for: the file "
                      f"sets it again after its `{k} = <number>` (or not at the top level); set it in "
                      f"one place")
    return module


def _with_sizes(path: Path, overrides: dict[str, int]):
    """(the file's code with each overridden size's own assignment, `batch_size = 16` at the
    top level, set to the new value, {size: (line, text)} of those it computes instead). What
    the file derives from a size at import (`input_shape = (batch_size, dim)`) then follows
    it, as if the file said the new value: setting it after the import would leave those at
    the old value, and the prompt and the inputs would disagree. A computed size keeps its
    assignment; asked for a value it does not come to, the import refuses (_import_problem)."""
    import ast
    source = path.read_text(errors="replace")
    try:
        tree = ast.parse(source, str(path))
    except SyntaxError as e:
        raise OpError(f"{path}:{e.lineno}: not valid Python: {e.msg}") from None
    computed: dict[str, tuple[int, str]] = {}
    changed: set[str] = set()  # sizes whose value the override changes
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for name in overrides:
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            value = getattr(node, "value", None)
            if (isinstance(node, ast.AugAssign) or len(targets) != 1
                    or not (isinstance(value, ast.Constant) and type(value.value) is int)):
                text = (ast.get_source_segment(source, node) or name).strip().splitlines()[0][:80]
                computed[name] = (node.lineno, text)
                continue
            if value.value != overrides[name]:
                changed.add(name)
            node.value = ast.copy_location(ast.Constant(overrides[name]), value)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    read |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for name in sorted(changed):
        if name not in read:  # not even by name in a string (globals()["dim"])
            raise OpError(f"{path}: --size {name}=... changes nothing: the file sets {name} but never "
                          f"reads it (does get_inputs() write its shapes as numbers?); use {name} where "
                          f"the shapes are made, or leave it out")
    return compile(tree, str(path), "exec"), computed


def _module_sizes(module) -> dict[str, int]:
    return {k: v for k, v in vars(module).items()
            if isinstance(v, int) and not isinstance(v, bool) and not k.startswith("_")}


def spec_from_problem_file(path: str | Path, dtype: str = "fp32",
                           overrides: dict[str, int] | None = None) -> OpSpec:
    path = Path(path).resolve()
    if not path.is_file():
        raise OpError(f"problem file {path} does not exist")
    if dtype not in DTYPES:
        raise OpError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    probe_import(path)
    module = _import_problem(path, overrides or {})
    sizes = _module_sizes(module)
    sys.modules.pop(module.__name__, None)
    return OpSpec(name=path.stem, source=str(path), sizes=tuple(sorted(sizes.items())),
                  dtype=dtype, kind="kernelbench")


def size_positions(path: str | Path, sizes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Where each size shows in get_inputs()'s shapes: {name: (input, dim)} for a dim whose
    extent is the size itself and follows it when it changes (the size doubled, the others
    kept). Sizes that no input's dim follows (a constant of the model) are left out.
    get_inputs() runs with torch's default device set to meta: shapes only, no data drawn."""
    import torch

    def shapes(values: dict[str, int]) -> list:
        module = _import_problem(Path(path), values)  # what the file derives follows too
        try:
            with torch.random.fork_rng(devices=[]), torch.device("meta"):
                xs = module.get_inputs()
        finally:
            sys.modules.pop(module.__name__, None)
        return [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in xs]

    try:
        base = shapes(sizes)
        _, computed = _with_sizes(Path(path), sizes)
        own = {k: v for k, v in sizes.items() if k not in computed}  # those computed follow these
        out: dict[str, tuple[int, int]] = {}
        for name, v in own.items():
            moved = shapes({**own, name: 2 * v})
            for i, (a, b) in enumerate(zip(base, moved)):
                hit = [d for d in range(len(a)) if a[d] == v and b[d] == 2 * v] \
                    if a is not None and b is not None and len(a) == len(b) else []
                if hit:
                    out[name] = (i, hit[0])
                    break
    except OpError:
        raise
    except Exception as e:  # noqa: BLE001 - a get_inputs that cannot run on meta tensors
        raise OpError(f"{path}: get_inputs() could not be run for its shapes alone ({type(e).__name__}: "
                      f"{e})") from None
    return out


def shape_only_arg_specs(spec: OpSpec):
    """(shape, dtype) of the kernel's inputs (then the Model's parameters and buffers) and
    outputs, as `ops.arg_specs(problem_op(spec))` gives them, from the file's Model and
    get_inputs() run on the meta device: no data drawn, nothing computed. None where the
    file cannot be run that way (the caller then builds the live op)."""
    import torch

    dt = torch_dtype(spec.dtype)
    try:
        module = _import_problem(Path(spec.source), spec.size_dict())
    except Exception:  # noqa: BLE001 - the live op says what is wrong with the file
        return None
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = module.Model(*module.get_init_inputs()).eval()
            xs = module.get_inputs()
            if not isinstance(xs, (list, tuple)) or not all(isinstance(x, torch.Tensor) for x in xs):
                return None
            params = [t.detach() for _, t in [*model.named_parameters(), *model.named_buffers()]]
            with torch.no_grad():
                outs = model.double()(*[x.double() if x.is_floating_point() else x for x in xs])
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in [*xs, *params, *outs]):
            return None  # made somewhere else (a device named in the file): not shapes alone
    except Exception:  # noqa: BLE001 - an op meta tensors do not support; the live op then
        return None
    finally:
        sys.modules.pop(module.__name__, None)

    def kept(t):
        return dt if t.is_floating_point() else t.dtype
    return ([(tuple(x.shape), kept(x)) for x in [*xs, *params]],
            [(tuple(o.shape), kept(o)) for o in outs])


def problem_op(spec: OpSpec) -> Op:
    """The live Op of a problem-file spec (see `ops.load_op`, which caches it). Building it
    seeds and draws (the model's parameters, a trial call): the caller's host random state is
    left as it was, since `tuner.runtime` builds ops in the user's own process (a GPU's
    generators are seeded too, as before, and not restored)."""
    import torch
    with torch.random.fork_rng(devices=[]):
        return _problem_op(spec)


def _problem_op(spec: OpSpec) -> Op:
    import torch

    module = _import_problem(Path(spec.source), spec.size_dict())
    dt = torch_dtype(spec.dtype)
    try:
        torch.manual_seed(0)  # parameters are fixed for the run; inputs are fresh per seed
        init = list(module.get_init_inputs())
        model = module.Model(*init).eval()
    except Exception as e:
        raise OpError(f"{spec.source}: Model(*get_init_inputs()) failed: {type(e).__name__}: {e}") from None
    params = [(n, t.detach()) for n, t in [*model.named_parameters(), *model.named_buffers()]]
    model64 = copy.deepcopy(model).double()
    model_dt = copy.deepcopy(model).to(dt) if dt is not torch.float64 else model64

    def cast(t):
        return t.to(dt) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    drawn_on_host: set[str] = set()  # device types this get_inputs() failed to draw on

    def make(seed: int, device=None) -> list:
        # get_inputs() draws where the inputs are wanted (torch's default device set there),
        # seeded without changing the caller's host random state: `tuner.runtime` makes inputs
        # in the user's own process. Drawn on the host and moved, a 64M-element set took about
        # a second on an H200's machine, and every measurement draws three fresh ones; a
        # get_inputs() that cannot run there (numpy, a host-only op) draws on the host. The same
        # seed gives the same inputs on the same kind of device, as for the built-in ops. The
        # parameters and buffers are drawn anew for each seed too, there (`redrawn`).
        kind = torch.device(device).type if device is not None else "cpu"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # a GPU's generators too
            xs = None
            if kind != "cpu" and kind not in drawn_on_host:
                try:
                    with torch.device(device):
                        xs = module.get_inputs()
                except Exception:  # noqa: BLE001 - drawn on the host below, with its own error
                    drawn_on_host.add(kind)
                    torch.manual_seed(seed)
            if xs is None:
                xs = module.get_inputs()
            xs = [x.to(device) if device is not None and isinstance(x, torch.Tensor) else x for x in xs]
            ps = [t.to(device) if device is not None else t for _, t in params]
            return [cast(x) for x in xs] + [cast(redrawn(t)) for t in ps]

    try:
        try:  # its length and kinds, on meta tensors: a full draw here cost seconds at 64M elements
            with torch.device("meta"):
                first = module.get_inputs()
        except Exception:  # noqa: BLE001 - one that cannot run on meta: drawn for real
            first = module.get_inputs()
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        raise OpError(f"{spec.source}: get_inputs() failed:\n{''.join(tb[-3:]).strip()}") from None
    if not isinstance(first, (list, tuple)):
        # A bare tensor would be taken row by row as separate inputs; a generator has no length.
        raise OpError(f"{spec.source}: get_inputs() returned a {type(first).__name__}; it must return a "
                      f"list of tensors, e.g. return [torch.randn(batch_size, dim)]")
    n_in = len(first)

    def as_list(out) -> list:
        return list(out) if isinstance(out, (tuple, list)) else [out]

    on_device: dict = {}  # (model id, device) -> a copy of the model there

    def on_inputs_device(model, xs):
        # A copy of the model with its parameters where the inputs are (a GPU worker's); the
        # host's model itself is never moved (meta inputs, for output shapes, would wipe its
        # weights). A model that makes host tensors in forward still fails on a GPU; the
        # verifier then computes its reference on the host (checks.reference_of).
        dev = next((x.device for x in xs if isinstance(x, torch.Tensor)), None)
        if dev is None or dev.type in ("cpu", "meta"):
            return model
        key = (id(model), str(dev))
        if key not in on_device:
            on_device[key] = copy.deepcopy(model).to(dev)
        return on_device[key]

    param_names = [n for n, _ in params]

    def ref(xs):  # with the parameters and buffers the kernel receives (after the inputs)
        with torch.no_grad():
            if not params:
                return as_list(on_inputs_device(model64, xs)(*xs[:n_in]))
            return as_list(torch.func.functional_call(on_inputs_device(model64, xs),
                                                      dict(zip(param_names, xs[n_in:])), tuple(xs[:n_in])))

    def impl(xs):
        with torch.no_grad():
            return as_list(on_inputs_device(model_dt, xs)(*xs[:n_in]))

    def call(xs):  # the caller's parameters, not the model's own (`Op.torch_call`)
        with torch.no_grad():
            return as_list(torch.func.functional_call(on_inputs_device(model_dt, xs),
                                                      dict(zip(param_names, xs[n_in:])), tuple(xs[:n_in])))

    if CHECKED_ELSEWHERE:  # a worker: shapes and FLOPs from meta tensors, if the Model runs there
        light = _on_meta(make, ref)
        if light is not None:
            sample, outs, flops = light
            return _op(spec, params, sample, outs, flops, make, ref, impl, call, init_context(module.Model, init))
    try:
        sample = make(0)
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        raise OpError(f"{spec.source}: get_inputs() failed:\n{''.join(tb[-3:]).strip()}") from None
    for i, x in enumerate(sample[:n_in]):
        if not isinstance(x, torch.Tensor):
            raise OpError(f"{spec.source}: get_inputs() returned a value of type {type(x).__name__} at position {i}; "
                          f"kernels take tensors only: make it a module constant or an argument of "
                          f"get_init_inputs() (Model.__init__) instead")
    try:
        # The FLOPs torch counts (matmuls, convolutions; not elementwise work): a lower bound
        # on the work, for the physics check that no kernel beats the device's peak.
        outs, flops = _count_flops(ref, [x.double() if x.is_floating_point() else x for x in sample])
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        raise OpError(f"{spec.source}: Model(...)(*get_inputs()) failed (in float64):\n"
                      f"{''.join(tb[-3:]).strip()}") from None
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise OpError(f"{spec.source}: Model.forward returned a {type(o).__name__}"
                          + (f" at position {i}" if len(outs) > 1 else "")
                          + "; it must return a tensor, or a tuple/list of tensors (the kernel's outputs)")
        if o.is_complex():
            raise OpError(f"{spec.source}: output {i} of Model.forward is {o.dtype}; kernels here "
                          f"write real (floating or integer) outputs only")
    for kind, tensors in (("input", sample), ("output", outs)):
        for i, t in enumerate(tensors):
            if t.numel() == 0:  # nothing to check or time; rates would divide by zero
                raise OpError(f"{spec.source}: {kind} {i} has no elements (shape {tuple(t.shape)}); "
                              f"give its sizes positive values (--size NAME=VALUE)")
    if not CHECKED_ELSEWHERE:
        _check_deterministic(spec, ref, sample, outs)
    return _op(spec, params, sample, outs, flops, make, ref, impl, call, init_context(module.Model, init))


def init_context(model_class, init: list) -> tuple[tuple[str, Any], ...]:
    """The numbers of get_init_inputs() as template names: `init0`, `init1`, ... by position,
    and by the name of the Model.__init__ parameter each one binds to (`out_features`), so a
    kernel can read a size that only the Model's constructor is given."""
    import inspect
    out: list[tuple[str, Any]] = []
    names: list[str | None] = [None] * len(init)
    try:
        bound = inspect.signature(model_class.__init__).bind(None, *init)
        by_value = list(bound.arguments.items())[1:]  # less self
        for i, (name, _) in enumerate(by_value[:len(init)]):
            names[i] = name
    except (TypeError, ValueError):
        pass
    for i, v in enumerate(init):
        if isinstance(v, (bool, int, float)):
            out.append((f"init{i}", v))
            if names[i] and names[i].isidentifier():
                out.append((names[i], v))
    return tuple(out)


def _count_flops(ref, doubles: list):
    """(outputs, the FLOPs torch counts or None) of the reference on `doubles`."""
    if not COUNT_FLOPS:
        return ref(doubles), None
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        outs = ref(doubles)
    return outs, float(counter.get_total_flops()) or None


def _on_meta(make, ref):
    """(sample, outputs, FLOPs) from the reference run on meta tensors (FLOPs are counted from
    shapes), or None where the Model cannot run there. For worker processes, whose parent ran
    it on real inputs and checked what it returned."""
    import torch
    try:
        sample = make(0, "meta")
        outs, flops = _count_flops(ref, [x.double() if x.is_floating_point() else x for x in sample])
    except Exception:  # noqa: BLE001 - the real inputs and reference then
        return None
    if not all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in [*sample, *outs]):
        return None
    return sample, outs, flops


def _op(spec: OpSpec, params: list, sample: list, outs: list, flops, make, ref, impl, call,
        context: tuple = ()) -> Op:
    n_in = len(sample) - len(params)
    names = tuple(f"in{i}" for i in range(n_in)) + tuple(re.sub(r"\W", "_", n) for n, _ in params)
    moved = sum(x.numel() * x.element_size() for x in sample) + sum(
        o.numel() * DTYPE_BYTES[spec.dtype] for o in outs)
    return Op(spec, names, tuple(f"out{i}" for i in range(len(outs))), make, ref, impl,
              flops, float(moved), TOLERANCE[spec.dtype], call if params else None, context)


def redrawn(t):
    """A parameter or buffer drawn anew around its values at init, for one verification set:
    every finite entry scaled by a random factor in [1/2, 2] and moved up by a random amount of
    up to a tenth of the tensor's typical size. A value that is constant at init (LayerNorm's
    weight of ones, a bias of zeros) is so no more, so a kernel that ignores it fails; signs
    are kept and a non-negative tensor stays positive (a running variance stays a variance);
    entries that are not finite (a mask of -inf) and integer tensors are kept as they are."""
    import torch
    if not t.is_floating_point() or t.device.type == "meta":  # meta: shapes only
        return t.clone()
    x = t.detach().double()
    finite = torch.isfinite(x)
    scale = float(x[finite].abs().mean()) if bool(finite.any()) else 1.0
    factor = torch.exp2(torch.rand(x.shape, dtype=torch.float64, device=x.device) * 2 - 1)
    shift = torch.rand(x.shape, dtype=torch.float64, device=x.device) * 0.1 * (scale if scale > 0 else 1.0)
    return torch.where(finite, x * factor + shift, x).to(t.dtype)


def _check_deterministic(spec: OpSpec, ref, sample: list, first: list) -> None:
    """Refuse a Model whose forward gives two answers for the same inputs (random ops in
    forward, dropout left on): no kernel could ever pass a check against it, and every config
    of the run would fail as a WRONG_RESULT that blames the kernel."""
    import torch

    # `first` came from these inputs; a forward that wrote its integer inputs changed them,
    # and is not deterministic as far as a check can tell either.
    again = ref([x.double() if x.is_floating_point() else x.clone() for x in sample])
    for i, (a, b) in enumerate(zip(first, again)):
        # torch.equal first: a deterministic forward is usually bit-identical, and allclose of
        # 64M float64 elements took seconds on the host.
        same = torch.equal(a, b) or (a.is_floating_point() and a.shape == b.shape
                                     and torch.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True))
        if not same:
            diff = (a.double() - b.double()).abs().nan_to_num(0).max().item() if a.shape == b.shape else None
            raise OpError(f"{spec.source}: output {i} of Model.forward differs between two calls on the "
                          f"same inputs" + (f" (by as much as {diff:.3g})" if diff is not None else "")
                          + "; a kernel cannot be checked against a reference that is not deterministic "
                            "(random ops in forward, such as torch.rand or F.dropout(training=True)?)")
