"""The package's shape, read statically (every dormouse/**/*.py parsed with `ast`, nothing imported):

- no import cycle among dormouse's modules;
- no torch.distributed under dormouse/model/, and no import of dormouse.parallel there: parallelism is
  applied to a plain model from outside (dormouse/parallel/);
- no file over MAX_FILE_LINES lines and no function over MAX_FUNCTION_LINES lines, but the few in
  ALLOWED_LONG, each with its reason.

The import rule: every `import` and `from ... import` statement counts, wherever it stands (inside a
function, under `if TYPE_CHECKING:`): a deferred import hides a cycle from the interpreter, not from a
reader. `import a.b.c` is an edge to a.b.c; `from a.b import c` to a.b.c where that is a module, else to
a.b; relative imports are resolved against the importing file's package. A package's `__init__.py`,
run on the way to its modules, is no edge of its own: the edge goes to the module named.
"""

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dormouse"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# "path" or "path::qualified.function" -> why it may be longer than the limit. Keep this list short.
ALLOWED_LONG: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, tuple[Path, ast.Module]]:
    """{module name: (path, syntax tree)} of every dormouse module."""
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, tree: ast.Module, modules: set[str]) -> set[str]:
    """The dormouse modules that module `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return out & modules


def import_graph() -> dict[str, set[str]]:
    trees = sources()
    modules = set(trees)
    return {name: imported(name, path, tree, modules) - {name} for name, (path, tree) in trees.items()}


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other: the strongly connected components of more than one
    module (Tarjan's algorithm)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per tangle."""
    return [_cycle_in(graph, component) for component in tangles(graph)]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first within the component)."""
    start = min(component)
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {component}")


def distributed_uses(tree: ast.Module) -> list[int]:
    """Lines that import torch.distributed (or a module under it) or reach it as `torch.distributed`."""
    torch_names, lines = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or (alias.name.startswith("torch.") and alias.asname is None):
                    torch_names.add(alias.asname or "torch")  # `import torch.x` binds `torch` too
                if alias.name == "torch.distributed" or alias.name.startswith("torch.distributed."):
                    lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if module == "torch.distributed" or module.startswith("torch.distributed."):
                lines.append(node.lineno)
            elif module == "torch" and any(alias.name == "distributed" for alias in node.names):
                lines.append(node.lineno)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "distributed"
            and isinstance(node.value, ast.Name)
            and node.value.id in torch_names
        ):
            lines.append(node.lineno)
    return sorted(set(lines))


def long_functions(tree: ast.Module) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function, nested ones too."""
    out = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def oversized() -> list[str]:
    """Every file and function over its limit, as "path (N lines)" / "path::name (N lines)"."""
    found = []
    for _, (path, tree) in sources().items():
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES:
            found.append((rel, n))
        found += [(f"{rel}::{name}", n) for name, n in long_functions(tree) if n > MAX_FUNCTION_LINES]
    return [f"{key} ({n} lines)" for key, n in found]


def test_dormouse_has_no_import_cycle():
    graph = import_graph()
    deferred = {"dormouse.train.trainer", "dormouse.decode.generate"}  # imported inside functions: they count
    assert graph["dormouse.commands"] >= deferred
    found = [f"{' -> '.join(_cycle_in(graph, t))} (the group: {', '.join(sorted(t))})" for t in tangles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_model_does_not_use_torch_distributed():
    hits = []
    graph = import_graph()
    for name, (path, tree) in sources().items():
        if name.startswith("dormouse.model."):
            hits += [f"{path.relative_to(ROOT)}:{line}" for line in distributed_uses(tree)]
            hits += [
                f"{path.relative_to(ROOT)} imports {m}"
                for m in sorted(graph[name])
                if m.startswith("dormouse.parallel")
            ]
    where = "torch.distributed under dormouse/model/ (apply parallelism in dormouse/parallel/)"
    assert not hits, where + ":\n" + "\n".join(hits)


def test_no_file_or_function_over_its_limit():
    over = [entry for entry in oversized() if entry.rsplit(" (", 1)[0] not in ALLOWED_LONG]
    limits = f"over {MAX_FILE_LINES} lines a file or {MAX_FUNCTION_LINES} a function (split it)"
    assert not over, limits + ":\n" + "\n".join(over)


def test_every_allowance_is_still_needed():
    stale = set(ALLOWED_LONG) - {entry.rsplit(" (", 1)[0] for entry in oversized()}
    assert not stale, f"within the limits now, drop from ALLOWED_LONG: {sorted(stale)}"


def test_the_checks_catch_what_they_name():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    for source in (
        "import torch.distributed as dist",
        "from torch import distributed",
        "from torch.distributed.fsdp import fully_shard",
        "import torch\ndef f():\n    return torch.distributed.get_rank()",
        "import torch.nn\nx = torch.distributed",
    ):
        assert distributed_uses(ast.parse(source)), source
    assert not distributed_uses(ast.parse("import torch\nfrom torch import nn\nx = nn.distributed"))
    tree = ast.parse("def f():\n    from . import b\n    from ..x import y\n    import dormouse.c\n")
    path = PACKAGE / "p" / "a.py"
    assert imported("dormouse.p.a", path, tree, {"dormouse.p.b", "dormouse.x", "dormouse.c"}) == {
        "dormouse.p.b",
        "dormouse.x",
        "dormouse.c",
    }
    nested = ast.parse("class C:\n    def m(self):\n        def inner():\n            pass\n")
    assert long_functions(nested) == [("C.m", 3), ("C.m.inner", 2)]


def unresolved_imports(paths: list[Path]) -> list[str]:
    """Each `import dormouse.…` / `from dormouse.… import name` in `paths` that names no module or
    attribute, as "path:line: what": GPU tests and bench scripts run only where CI does not, so their
    imports are checked here, on any machine."""
    missing = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                wanted = [(alias.name, None) for alias in node.names if alias.name.startswith("dormouse")]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("dormouse"):
                wanted = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in wanted:
                try:
                    found = importlib.import_module(module)
                    if name is not None and not hasattr(found, name):
                        importlib.import_module(f"{module}.{name}")
                except ModuleNotFoundError as err:
                    if err.name in ("triton", "fla"):
                        continue  # a kernel module: it imports where Triton is
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    missing.append(f"{where}:{node.lineno}: {module}{'.' + name if name else ''}")
    return missing


def test_imports_of_dormouse_in_tests_and_benches_resolve():
    paths = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benches").rglob("*.py"))
    missing = unresolved_imports(paths)
    assert not missing, "imports that name nothing in dormouse/:\n" + "\n".join(missing)


def test_an_import_of_a_moved_name_is_caught(tmp_path):
    script = tmp_path / "gpu_test.py"
    script.write_text("from dormouse.tools.bench import no_such_name\nimport dormouse.no_such_module\n")
    assert [m.split(": ")[1] for m in unresolved_imports([script])] == [
        "dormouse.tools.bench.no_such_name",
        "dormouse.no_such_module",
    ]
