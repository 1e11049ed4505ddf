"""A space of tunables: named finite params, constraints and resource formulas.

Written in YAML (see README, "Skeletons"). One file drives three things: the Optuna
distributions, the pre-compile feasibility filter, and (on Ascend) the simulator. A space
that cannot be used is rejected when it is loaded, with the file and line, before any trial.
"""

from __future__ import annotations

import itertools
import keyword
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from tuner.core import expr as _expr
from tuner.core.values import Config

# Pairs of moves `Space.repair` tries at most at a step where no single move helps (each costs one
# evaluation of the formulas: ~20 us).
_REPAIR_PAIRS = 2000
# Configs a search starts from where the default is rejected at the shape (`Space.starts`).
MAX_STARTS = 3

# Names a space may read besides its params, its declared sizes and its resources. ARCH (the
# compute capability as one number, 90 for sm_90) is given by the cuda backend only: elsewhere a
# formula that reads it fails, and the config is invalid with that reason.
CONTEXT_NAMES = frozenset({"DTYPE_BYTES", "CORES", "ARCH"})
MAX_PARAM_VALUES = 4096
MAX_SPACE_SIZE = 10**12
# Literals in Jinja and in expressions: a param of one of these names could not be read.
_RESERVED = frozenset({"true", "false", "none", "True", "False", "None"})


class SpaceError(ValueError):
    """A space that cannot be used. The message names the file and line where it can."""


@dataclass(frozen=True)
class Param:
    name: str
    values: tuple[Any, ...]
    log: bool = False  # declared as a pow2 range: neighbours differ by a factor, not a step

    @property
    def ordered(self) -> bool:
        """Numeric values with an order that means something (ints/floats, not bools)."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)


@dataclass(frozen=True)
class Rule:
    expr: _expr.Expr
    line: int = 0


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]
    constraints: tuple[Rule, ...] = ()
    resources: tuple[tuple[str, Rule], ...] = ()
    sizes: tuple[str, ...] = ()
    default: tuple[tuple[str, Any], ...] = ()
    source: str = "<space>"
    meta: tuple[tuple[str, Any], ...] = ()  # template, language, backend, ...
    # Configs the space's author (a person, or the model that wrote the skeleton) expects to
    # be fast, partial (the rest from the default): tried right after the default and any
    # warm-start configs, so a good guess costs an evaluation, not a search.
    promising: tuple[tuple[tuple[str, Any], ...], ...] = ()

    # ---- queries -------------------------------------------------------------------------

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def failed_shape_constraint(self, context: dict[str, Any]) -> str | None:
        """The first constraint that reads no param and no resource (e.g. `M <= 16`) and is
        false under `context` (sizes, DTYPE_BYTES, CORES, ...), or None: where one is, no config
        of the space is valid. One that fails to evaluate is left to `check`, which says why
        per config."""
        config_names = set(self.names) | {name for name, _ in self.resources}
        for rule in self.constraints:
            if rule.expr.names & config_names:
                continue
            try:
                if not rule.expr(dict(context)):
                    return rule.expr.text
            except _expr.ExprError:
                continue
        return None

    @property
    def size(self) -> int:
        return math.prod(len(p.values) for p in self.params)

    def get_meta(self, key: str, default: Any = None) -> Any:
        return dict(self.meta).get(key, default)

    def configs(self) -> Iterator[Config]:
        """Every config in declaration order (for grid search and exhaustive sweeps)."""
        for combo in itertools.product(*(p.values for p in self.params)):
            yield Config.of(dict(zip(self.names, combo)))

    def default_config(self) -> Config:
        """The declared default, or each param's middle value."""
        chosen = dict(self.default)
        for p in self.params:
            chosen.setdefault(p.name, p.values[(len(p.values) - 1) // 2])
        return Config.of(chosen)

    def contains(self, config: Config) -> bool:
        d = config.as_dict()
        return set(d) == set(self.names) and all(_member(d[p.name], p.values) for p in self.params)

    def complete(self, config: Config | dict) -> Config | None:
        """The config as a point of this space, params it lacks taken from the default: a
        config measured before the space grew a param (an older run, a landscape) still
        says where to start. None when it names a param the space lacks or a value outside one."""
        d = config.as_dict() if isinstance(config, Config) else dict(config)
        if not set(d) <= set(self.names):
            return None
        full = Config.of({**self.default_config().as_dict(), **d})
        return full if self.contains(full) else None

    def evaluate_resources(self, config: Config, context: dict[str, Any]) -> dict[str, float]:
        env = {**context, **config.as_dict()}
        out: dict[str, float] = {}
        for name, rule in self.resources:
            out[name] = rule.expr(env)
            env[name] = out[name]
        return out

    def check(self, config: Config, context: dict[str, Any],
              limits: dict[str, float] | None = None) -> str | None:
        """Why `config` is INVALID under `context` (sizes, DTYPE_BYTES, CORES, ARCH), or None.

        A resource whose name the device lists in `limits` must not exceed it. An expression
        that fails to evaluate (e.g. divides by zero) makes the config invalid, with the reason.
        """
        if not self.contains(config):
            return f"config {config} is not a point of this space"
        missing = [s for s in self.sizes if s not in context]
        if missing:
            have = sorted(k for k, v in context.items() if k not in CONTEXT_NAMES
                          and isinstance(v, int) and not isinstance(v, bool))  # sizes, not dtype/op
            raise SpaceError(f"{self.source}: the op provides no size(s) {missing}; "
                             f"it has {have}")
        # A param named as a size (or dtype, CORES...) would hide it from the formulas and the
        # template: {{ N }} rendered the param's value, and every config computed garbage.
        clash = [p.name for p in self.params if p.name in context]
        if clash:
            raise SpaceError(f"{self.source}: param(s) {clash} have the name of what the op and the backend "
                             f"give the template and the formulas (sizes, dtype, CORES, ...); rename them")
        try:
            env = {**context, **config.as_dict()}
            for name, value in self.evaluate_resources(config, context).items():
                env[name] = value
                limit = (limits or {}).get(name)
                if limit is not None and value > limit:
                    return f"resource {name} = {value:g} exceeds the device limit {limit:g}"
            for rule in self.constraints:
                if not rule.expr(env):
                    return f"constraint failed: {rule.expr.text}"
        except _expr.ExprError as e:
            return f"expression error: {e}"
        return None

    def violation(self, config: Config, context: dict[str, Any],
                  limits: dict[str, float] | None = None) -> float:
        """0 for a valid config; else how far it is from valid (resources over their limit by
        their relative excess, constraints by `Expr.violation`; an expression error counts
        100). Only for steering `repair`; `check` says why."""
        try:
            env = {**context, **config.as_dict()}
            total = 0.0
            for name, value in self.evaluate_resources(config, context).items():
                env[name] = value
                limit = (limits or {}).get(name)
                if limit is not None and value > limit:
                    total += 1e-3 + (value - limit) / (abs(value) + abs(limit) + 1e-12)
            for rule in self.constraints:
                total += rule.expr.violation(env)
            return total
        except _expr.ExprError:
            return 100.0

    def starts(self, context: dict[str, Any], limits: dict[str, float] | None = None) -> list[Config]:
        """Where a search begins: the default config and, when the formulas reject it at this
        shape, the configs nearest to it that they accept, so the search starts next to what
        the space's author meant. Where several single changes each make the default valid,
        each is as near as the others and the author's intent does not choose between them
        (a one-pass default whose block is short of this row: the looped kernel at that
        block, or one pass with a block as long as the row; they can be 1.4x apart either
        way): up to MAX_STARTS of them, the smallest changes first. Where no single change
        does, the nearest by `repair`."""
        default = self.default_config()
        if self.check(default, context, limits) is None:
            return [default]
        d = default.as_dict()
        nearest = []  # per param, its smallest change that repairs the default: (steps, config)
        for p in self.params:
            at = self._at(p, d)
            moves = sorted(((abs(j - at), Config.of({**d, p.name: value})) for j, value in enumerate(p.values)
                            if value != d[p.name]), key=lambda m: m[0])
            fix = next((m for m in moves if self.check(m[1], context, limits) is None), None)
            if fix is not None:
                nearest.append(fix)
        near = [c for _, c in sorted(nearest, key=lambda sc: sc[0])][:MAX_STARTS]
        if not near:
            repaired = self.repair(default, context, limits)
            near = [repaired] if repaired is not None else []
        return [default] + near

    def promising_configs(self, context: dict[str, Any], limits: dict[str, float] | None = None,
                          notes: list[str] | None = None) -> list[Config]:
        """The `promising` configs at this shape: each one the formulas reject replaced by the
        nearest config they accept (`repair`), and dropped when there is none; `notes` gets a
        line for each one replaced or dropped, and why."""
        out: list[Config] = []
        for i, partial in enumerate(self.promising):
            config = self.complete(dict(partial))
            why = self.check(config, context, limits) if config is not None else "not a point of the space"
            if config is not None and why is not None:
                config = self.repair(config, context, limits)
            if why is not None and notes is not None:
                instead = f"trying the nearest valid config, {config}" if config is not None else "dropped"
                notes.append(f"promising config {i + 1} ({Config.of(dict(partial))}) is rejected "
                             f"at this shape ({why}): {instead}")
            if config is not None and config not in out:
                out.append(config)
        return out

    def repair(self, config: Config, context: dict[str, Any], limits: dict[str, float] | None = None,
               max_steps: int = 100, keep: tuple[str, ...] = ()) -> Config | None:
        """A valid config near `config`: one param at a time (never those in `keep`), the move
        that most reduces the violation (ties: the smallest move), until valid. None when no
        move helps. For a default that the constraints reject at this shape, so the search
        starts next to what the space's author meant, not at random in a space that may be
        mostly invalid; with `keep`, to complete a move the constraints reject (see
        `guided.GuidedSearch`)."""
        current = config.as_dict()
        v = self.violation(config, context, limits)
        free = [p for p in self.params if p.name not in keep and len(p.values) > 1]
        for _ in range(max_steps):
            if v == 0.0:
                return Config.of(current)
            moves = [((p.name, value, abs(j - self._at(p, current))),) for p in free
                     for j, value in enumerate(p.values) if value != current[p.name]]
            best = self._best_move(moves, current, v, context, limits)
            if best is None:
                # No single move helps: two coupled ones may (a one-pass kernel needs its block
                # up to the row and, for the registers that takes, the rows per program down).
                pairs = [a + b for k, a in enumerate(moves) for b in moves[k + 1:] if a[0][0] != b[0][0]]
                pairs.sort(key=lambda m: m[0][2] + m[1][2])  # the smallest first: a bounded cost
                best = self._best_move(pairs[:_REPAIR_PAIRS], current, v, context, limits)
            if best is None:
                return None
            (v, _), move = best
            current.update({name: value for name, value, _ in move})
        return Config.of(current) if v == 0.0 else None

    @staticmethod
    def _at(p: Param, current: dict[str, Any]) -> int:
        return p.values.index(current[p.name]) if current[p.name] in p.values else 0

    def _best_move(self, moves: list[tuple], current: dict[str, Any], v: float, context: dict[str, Any],
                   limits: dict[str, float] | None) -> tuple | None:
        """The move (one or more (param, value, steps)) that most reduces the violation below
        `v`, the smallest on a tie; None when none reduces it."""
        best = None
        for move in moves:
            trial = Config.of({**current, **{name: value for name, value, _ in move}})
            key = (self.violation(trial, context, limits), sum(d for _, _, d in move))
            if key[0] < v and (best is None or key < best[0]):
                best = (key, move)
        return best

    # ---- serialisation -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "params": {p.name: {"values": list(p.values), "log": p.log} for p in self.params},
            "constraints": [r.expr.text for r in self.constraints],
            "resources": {n: r.expr.text for n, r in self.resources},
            "sizes": list(self.sizes), "default": dict(self.default),
            "source": self.source, "meta": dict(self.meta),
            "promising": [dict(c) for c in self.promising],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Space":
        return cls(
            params=tuple(Param(n, tuple(p["values"]), p.get("log", False))
                         for n, p in data["params"].items()),
            constraints=tuple(Rule(_expr.parse(t)) for t in data.get("constraints", [])),
            resources=tuple((n, Rule(_expr.parse(t))) for n, t in data.get("resources", {}).items()),
            sizes=tuple(data.get("sizes", [])), default=tuple(sorted(data.get("default", {}).items())),
            source=data.get("source", "<space>"), meta=tuple(sorted(data.get("meta", {}).items())),
            promising=tuple(tuple(sorted(c.items())) for c in data.get("promising", [])))


def _member(value: Any, values: tuple[Any, ...]) -> bool:
    """`value in values`, except that True is not 1 and 0 is not False: the two would give one
    point two config keys."""
    return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in values)


# ---- loading from YAML ------------------------------------------------------------------

_TOP_KEYS = {"params", "constraints", "resources", "sizes", "default", "promising",
             "template", "language", "backend", "description"}
MAX_PROMISING = 32  # configs tried before the search proper: more would be a search of its own


def load_space(path: str | Path) -> Space:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpaceError(f"cannot read space file {path}: {e.strerror}") from None
    return parse_space(text, str(path))


class _SpaceLoader(yaml.SafeLoader):
    """YAML for spaces, which models write: plain mappings, lists and scalars only. No aliases
    (`*name`: an alias bomb expands exponentially), no tags (`!foo`, `!!binary`), and dates
    stay strings (a date is not a value a param or a description can hold in JSON)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "an alias (*name) is not allowed in a space: "
                                              "write the value out", event.start_mark)
        node = super().compose_node(parent, index)
        if node.tag not in _PLAIN_TAGS:
            raise yaml.composer.ComposerError(None, None, f"the tag {node.tag!r} is not allowed in a space; "
                                              f"write plain values", node.start_mark)
        return node


_PLAIN_TAGS = {"tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_SpaceLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag in _PLAIN_TAGS]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _refuse_tag(loader, node):
    raise yaml.constructor.ConstructorError(None, None, f"the tag {node.tag!r} is not allowed in a space; "
                                            f"write plain values", node.start_mark)


for _tag in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary", "tag:yaml.org,2002:set",
             "tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs"):
    _SpaceLoader.add_constructor(_tag, _refuse_tag)
_SpaceLoader.add_constructor(None, _refuse_tag)


def parse_space(text: str, source: str = "<space>") -> Space:
    """Parse and validate a space. Raises SpaceError naming `source` and the line."""
    try:
        return _parse_space(text, source)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise SpaceError(f"{source}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None


def _parse_space(text: str, source: str) -> Space:
    root = yaml.compose(text, Loader=_SpaceLoader)
    if root is None or not isinstance(root, yaml.MappingNode):
        raise SpaceError(f"{source}: a space is a YAML mapping with at least a 'params' key")

    def err(node: yaml.Node | None, msg: str) -> SpaceError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return SpaceError(f"{source}{line}: {msg}")

    top = {k.value: (k, v) for k, v in root.value}
    unknown = set(top) - _TOP_KEYS
    if unknown:
        k = top[sorted(unknown)[0]][0]
        raise err(k, f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    if "params" not in top:
        raise err(root, "no 'params': a space needs at least one tunable parameter")

    pnode = top["params"][1]
    if not isinstance(pnode, yaml.MappingNode) or not pnode.value:
        raise err(pnode, "'params' must be a non-empty mapping of name -> values")
    params = []
    for knode, vnode in pnode.value:
        name = knode.value
        if not str(name).isidentifier():
            raise err(knode, f"param name {name!r} is not an identifier")
        if keyword.iskeyword(name) or name in _RESERVED:
            # A keyword cannot be read by an expression, nor by the template (`{{ if }}`).
            raise err(knode, f"param name {name!r} is a reserved word; rename it")
        if name in {p.name for p in params}:
            raise err(knode, f"param {name!r} declared twice")
        if name in CONTEXT_NAMES:
            raise err(knode, f"param name {name!r} is what the backend gives the formulas; rename it")
        params.append(_param(name, _data(vnode), lambda m, n=vnode: err(n, m)))

    sizes: list[str] = []
    if "sizes" in top:
        snode = top["sizes"][1]
        sizes = _data(snode)
        if not isinstance(sizes, list) or not all(isinstance(s, str) and s.isidentifier() for s in sizes):
            raise err(snode, "'sizes' must be a list of problem-size names, e.g. [M, N]")
        for knode, _ in pnode.value:  # pointed at the param, the line to change
            if knode.value in sizes:
                raise err(knode, f"param {knode.value!r} has the name of a size (sizes: {sizes}); rename the param")

    known = {p.name for p in params} | set(sizes) | CONTEXT_NAMES
    resources: list[tuple[str, Rule]] = []
    if "resources" in top:
        rnode = top["resources"][1]
        if not isinstance(rnode, yaml.MappingNode):
            raise err(rnode, "'resources' must be a mapping of name -> formula")
        for knode, vnode in rnode.value:
            if not str(knode.value).isidentifier() or keyword.iskeyword(knode.value) or knode.value in _RESERVED:
                raise err(knode, f"resource name {knode.value!r} is not an identifier")
            if knode.value in known:  # it would shadow the param (or size) in every later formula
                raise err(knode, f"resource {knode.value!r} has the name of a param, a size, "
                                 f"an earlier resource or {sorted(CONTEXT_NAMES)}; rename it")
            rule = _rule(vnode, known, err)
            resources.append((knode.value, rule))
            known.add(knode.value)  # later formulas and constraints may use earlier resources

    constraints: list[Rule] = []
    if "constraints" in top:
        cnode = top["constraints"][1]
        if not isinstance(cnode, yaml.SequenceNode):
            raise err(cnode, "'constraints' must be a list of boolean expressions")
        constraints = [_rule(n, known, err) for n in cnode.value]

    byname = {p.name: p for p in params}

    def point(node: yaml.Node, data: Any, what: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise err(node, f"{what} must be a mapping of param -> value")
        for k, v in data.items():
            if isinstance(k, bool):  # `OFF: 1` in a mapping: YAML 1.1 reads the key as False
                raise err(node, f"{what} names {k!r}, not a param: YAML reads a bare yes, no, on or "
                                f"off as a boolean; quote the param's name (e.g. 'OFF': 1)")
            if k not in byname:
                raise err(node, f"{what} names unknown param {k!r}")
            if not _member(v, byname[k].values):
                raise err(node, f"{what} {k}={v!r} is not one of {list(byname[k].values)}")
        return data

    default: dict[str, Any] = {}
    if "default" in top:
        dnode = top["default"][1]
        default = point(dnode, _data(dnode) or {}, "default")
    promising: list[dict[str, Any]] = []
    if "promising" in top:
        key, seq = top["promising"]
        if not isinstance(seq, yaml.SequenceNode):
            raise err(key, "'promising' must be a list of configs (mappings of param -> value; "
                           "params left out take the default)")
        if len(seq.value) > MAX_PROMISING:
            raise err(key, f"'promising' lists {len(seq.value)} configs; at most {MAX_PROMISING}")
        promising = [point(n, _data(n), f"promising config {i + 1}") for i, n in enumerate(seq.value)]

    meta = {k: _data(top[k][1]) for k in ("template", "language", "backend", "description") if k in top}
    space = Space(tuple(params), tuple(constraints), tuple(resources), tuple(sizes),
                  tuple(sorted(default.items())), source, tuple(sorted(meta.items())),
                  tuple(tuple(sorted(c.items())) for c in promising))
    if space.size > MAX_SPACE_SIZE:
        raise err(pnode, f"space has {space.size:.3g} points; at most {MAX_SPACE_SIZE:.0g}")
    return space


def _data(node: yaml.Node) -> Any:
    return yaml.load(yaml.serialize(node), Loader=_SpaceLoader)  # noqa: S506 - the restricted loader above


def _rule(node: yaml.Node, known: set[str], err) -> Rule:
    text = _data(node)
    try:
        e = _expr.parse(text)
    except _expr.ExprError as x:
        raise err(node, str(x)) from None
    unknown = e.names - known
    if unknown:
        raise err(node, f"unknown name(s) {sorted(unknown)} in {e.text!r}; known: params, "
                        f"sizes (declare them under 'sizes:'), resources, {sorted(CONTEXT_NAMES)}")
    return Rule(e, node.start_mark.line + 1)


def _param(name: str, spec: Any, err) -> Param:
    """Value lists, {pow2: [lo, hi]}, {range: [lo, hi], step: s}, or `bool`."""
    if spec == "bool" or spec == {"bool": True}:
        return Param(name, (False, True))
    if isinstance(spec, list):
        if not spec:
            raise err(f"param {name!r} has no values")
        for v in spec:
            if not isinstance(v, (int, float, str, bool)):
                raise err(f"param {name!r}: value {v!r} must be a number, string or boolean")
            if isinstance(v, float) and not math.isfinite(v):  # nan != nan: no config could hold it
                raise err(f"param {name!r}: value {v!r} must be a finite number")
        for i, v in enumerate(spec):
            if _member(v, tuple(spec[:i])):  # 1 and 1.0 are one point (True and 1 are not)
                raise err(f"param {name!r} lists the value {v!r} twice")
        return _sized(name, tuple(spec), False, err)
    if isinstance(spec, dict) and "pow2" in spec:
        lo, hi = _bounds(name, spec["pow2"], err)
        if lo <= 0 or lo & (lo - 1) or hi & (hi - 1):
            raise err(f"param {name!r}: pow2 bounds must be powers of two, got [{lo}, {hi}]")
        vals = tuple(2**i for i in range(lo.bit_length() - 1, hi.bit_length()))
        return _sized(name, vals, True, err)
    if isinstance(spec, dict) and "range" in spec:
        lo, hi = _bounds(name, spec["range"], err)
        step = spec.get("step", 1)
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
            raise err(f"param {name!r}: step must be a positive integer")
        values = range(lo, hi + 1, step)
        if len(values) > MAX_PARAM_VALUES:  # before the tuple: {range: [1, 10**12]} fills the memory
            raise err(f"param {name!r} has {len(values)} values; at most {MAX_PARAM_VALUES}")
        return _sized(name, tuple(values), False, err)
    raise err(f"param {name!r}: expected a list of values, {{pow2: [lo, hi]}}, "
              f"{{range: [lo, hi], step: s}} or 'bool', got {spec!r}")


def _bounds(name: str, b: Any, err) -> tuple[int, int]:
    if (not isinstance(b, list) or len(b) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in b)):
        raise err(f"param {name!r}: bounds must be [lo, hi] integers, got {b!r}")
    if b[0] > b[1]:
        raise err(f"param {name!r}: empty range [{b[0]}, {b[1]}]")
    return b[0], b[1]


def _sized(name: str, vals: tuple, log: bool, err) -> Param:
    if not vals:
        raise err(f"param {name!r} has no values")
    if len(vals) > MAX_PARAM_VALUES:
        raise err(f"param {name!r} has {len(vals)} values; at most {MAX_PARAM_VALUES}")
    return Param(name, vals, log)
