"""The Jinja template checker: the ways template code reaches Python internals."""

from __future__ import annotations

from tuner.codecheck.findings import Finding, source_line


def check_template(template: str) -> list[Finding]:
    """Underscore attributes (`x.__class__`, `x['_y']`) and the `attr` filter in a Jinja
    template: the ways template code reaches Python internals. (Templates also render in a
    sandbox; this names the line before anything renders.)"""
    import jinja2
    from jinja2 import nodes
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as e:
        return [Finding(e.lineno or 0, source_line(template, e.lineno or 0), f"template syntax error: {e.message}")]
    out = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        name = None
        if isinstance(node, nodes.Getattr):
            name = node.attr
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            name = node.arg.value
        if isinstance(node, nodes.Filter) and node.name == "attr":
            out.append(Finding(node.lineno, source_line(template, node.lineno), "the attr filter"))
        elif name is not None and name.startswith("_"):
            out.append(Finding(node.lineno, source_line(template, node.lineno),
                               f"underscore name {name!r} in a template expression"))
    return sorted(out, key=lambda f: f.line)
