import ast
import importlib
from pathlib import Path

import pytest

from dormouse import ledger

ROOT = Path(__file__).resolve().parents[1]


def test_the_modules_all_sites_skips_register_nothing():
    # They import only where Triton is; a site registered there would be missing from the ledger on a CPU.
    for name in ledger.TRITON_ONLY:
        source = (ROOT / (name.replace(".", "/") + ".py")).read_text()
        assert "ledger" not in source and "register(" not in source, name


def site_uses() -> list[tuple[str, str, ledger.Kind]]:
    """Every use of a site in dormouse/, as (file:line, site, the kind the use needs): `ledger.count(site)`
    needs COUNTED; `ledger.refuse(site, …)`, an op's `registry.Op(name, flag, site, …)` and
    `registry.required(found, site, …)`, which refuse at it, need LOUD. A site is a string or a module
    global (`NAME` or `module.NAME`)."""
    uses = []
    for path in sorted((ROOT / "dormouse").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner, name = getattr(node.func.value, "id", None), node.func.attr
            if owner == "ledger" and name in ("count", "refuse"):
                arg = node.args[0]
            elif owner == "registry" and name == "Op":
                arg = node.args[2] if len(node.args) > 2 else next(k.value for k in node.keywords if k.arg == "site")
            elif owner == "registry" and name == "required":
                arg = node.args[1]
            else:
                continue
            if module == "dormouse.ops.registry":
                continue  # `op.site` and the `site` parameter: their callers' sites are the uses above
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            uses.append((where, site_value(arg, module), ledger.Kind.COUNTED if name == "count" else ledger.Kind.LOUD))
    return uses


def site_value(arg: ast.expr, module: str) -> str:
    """The site an argument names: a string, or a global of `module` (`NAME`, `other.NAME`)."""
    if isinstance(arg, ast.Constant):
        return arg.value
    names = []
    while isinstance(arg, ast.Attribute):
        names.insert(0, arg.attr)
        arg = arg.value
    value = getattr(importlib.import_module(module), arg.id)
    for name in names:
        value = getattr(value, name)
    return value


def test_every_site_is_used_as_the_kind_it_is_registered_with():
    sites = {s.name: s for s in ledger.all_sites()}
    uses = site_uses()
    for where, site, kind in uses:
        assert site in sites, f"{where} uses ledger site {site!r}, which is not registered"
        assert sites[site].kind is kind, (
            f"{where} uses {site} as {kind.value}; it is registered {sites[site].kind.value}"
        )
    unused = set(sites) - {site for _, site, _ in uses}
    assert not unused, f"registered ledger sites that no code counts or refuses at: {sorted(unused)}"


def test_every_site_has_a_reason():
    sites = ledger.all_sites()
    assert sites, "the ledger is empty"
    for s in sites:
        assert s.reason.strip() and "\n" not in s.reason, s.name


def test_misuse_is_refused():
    with pytest.raises(KeyError, match="not registered"):
        ledger.count("no.such.site")
    name = ledger.all_sites()[0].name
    wrong = ledger.Kind.COUNTED if ledger.SITES[name].kind is ledger.Kind.LOUD else ledger.Kind.LOUD
    with pytest.raises(ValueError, match="used as"):
        if wrong is ledger.Kind.COUNTED:
            ledger.count(name)
        else:
            ledger.refuse(name, "x")


def test_counted_summary_format():
    ledger.COUNTS.clear()
    assert ledger.counted_summary() == "0"
    ledger.SITES["test.counted"] = ledger.Site("test.counted", ledger.Kind.COUNTED, "test", __name__)
    try:
        ledger.count("test.counted")
        ledger.count("test.counted")
        assert ledger.counted_summary() == "2(test.counted:2)"
    finally:
        del ledger.SITES["test.counted"]
        ledger.COUNTS.clear()
