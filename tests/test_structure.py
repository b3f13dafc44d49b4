"""The package's shape stays as designed: no import circles inside `feather/`; the core (the
CHT, the policies, the workloads) reaches no engine, simulator, pipeline, benchmark or CLI;
the engines are a leaf below the pipeline, the simulator and the CLI; the kernels never reach
into the simulator.

Imports are read from the source (ast), not by importing: every `import` / `from ... import`
counts wherever it stands - inside functions too, since a lazy import is still a dependency -
except under `if TYPE_CHECKING:`, which never runs. An edge goes to the most specific module
named: `from feather.sim import l2` is an edge to `feather.sim.l2`, `from feather.sim.l2
import fast_l2` one to `feather.sim.l2`. A package's `__init__` is the module `feather.x`.
`dependency_graph` adds the modules a file names in strings (`"feather.policies.fcfs:FCFSPolicy"`,
a dotted scheduler class): an import by name is an edge no import statement shows.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "feather"


def module_name(path: Path, root: Path = PACKAGE_ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node, skipping the bodies of `if TYPE_CHECKING:` (their `else` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(path: Path, modules: dict[str, Path], root: Path = PACKAGE_ROOT) -> set[str]:
    """The package's modules this file imports (see the module docstring)."""
    name = module_name(path, root)
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = [resolve(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else resolve(stem)
                for alias in node.names
            ]
        else:
            continue
        out.update(m for m in found if m and m.split(".")[0] == "feather" and m != name)
    return out


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    modules = package_modules(root)
    return {name: imported_modules(path, modules, root) for name, path in modules.items()}


_DOTTED = re.compile(r"^feather(?:\.[A-Za-z_]\w*)+")


def string_references(path: Path, modules: dict[str, Path], root: Path = PACKAGE_ROOT) -> set[str]:
    """The package's modules this file names in string constants (`feather.x.y`, `...:Class`,
    `feather.x.y.Class`), each resolved to the most specific module."""
    name = module_name(path, root)
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _DOTTED.match(node.value.strip())
            target = match.group(0) if match else ""
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def dependency_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Imports and string references together."""
    modules = package_modules(root)
    return {
        name: imported_modules(path, modules, root) | string_references(path, modules, root)
        for name, path in modules.items()
    }


def in_layer(module: str, layers: tuple[str, ...]) -> bool:
    """Whether `module` is one of `layers` or inside one (`feather.cli` is not `cli_values`)."""
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


# ---- the checker itself, on small packages written for the purpose


def _write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "feather"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    pkg = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from feather.b import g\n",
        "b.py": "def g():\n    from feather import a\n    return a\n",
        "c.py": "import feather.a\n",
    })
    assert import_cycles(import_graph(pkg)) == [["feather.a", "feather.b"]]


def test_type_checking_imports_and_relative_imports(tmp_path: Path) -> None:
    pkg = _write_package(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "from .x import f\n",
        "sub/x.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from feather.sub.y import Y\n"
            "else:\n    from ..z import Z\n"
            "def f(): ...\n"
        ),
        "sub/y.py": "from . import x\n",
        "z.py": "",
    })
    graph = import_graph(pkg)
    assert graph["feather.sub"] == {"feather.sub.x"}
    assert graph["feather.sub.x"] == {"feather.z"}  # the TYPE_CHECKING import is not counted
    assert graph["feather.sub.y"] == {"feather.sub.x"}
    assert import_cycles(graph) == []


def test_a_class_named_by_a_string_is_an_edge(tmp_path: Path) -> None:
    pkg = _write_package(tmp_path, {
        "__init__.py": "",
        "core.py": 'TABLE = {"x": "feather.sim.batches:Fixed", "doc": "see feather/sim"}\n',
        "sim/__init__.py": "",
        "sim/batches.py": "class Fixed: ...\n",
    })
    graph = dependency_graph(pkg)
    assert graph["feather.core"] == {"feather.sim.batches"}  # a path with slashes is prose
    assert import_graph(pkg)["feather.core"] == set()


# ---- the package

CORE = ("feather.cht", "feather.chunk_hash", "feather.policies", "feather.workloads")
ABOVE_THE_CORE = ("feather.engines", "feather.sim", "feather.pipeline", "feather.cli",
                  "feather.overhead", "feather.bench")
ABOVE_THE_ENGINES = ("feather.sim", "feather.pipeline", "feather.cli", "feather.overhead",
                     "feather.bench")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_circles_inside_the_package(graph: dict[str, set[str]]) -> None:
    cycles = import_cycles(graph)
    assert not cycles, "import circles (move the shared piece where both sides import it): " + (
        "; ".join(" <-> ".join(c) for c in cycles)
    )


def test_the_kernels_never_reach_the_simulator(graph: dict[str, set[str]]) -> None:
    kernels = [name for name in graph if name.startswith("feather.kernels")]
    assert kernels
    offending = {
        name: sorted(m for m in reachable(graph, name) if m.startswith("feather.sim"))
        for name in kernels
    }
    offending = {name: mods for name, mods in offending.items() if mods}
    assert not offending, f"feather/kernels reaches the simulator: {offending}"


def test_the_batch_prefix_tree_is_one_core_module(graph: dict[str, set[str]]) -> None:
    users = {name for name, deps in graph.items() if "feather.batch_tree" in deps}
    expected = {"feather.kernels.tree", "feather.sim.l2", "feather.sim.cost", "feather.bench.l2"}
    assert expected <= users
    assert not any(m.startswith("feather.sim") for m in reachable(graph, "feather.batch_tree"))


@pytest.fixture(scope="module")
def dependencies() -> dict[str, set[str]]:
    return dependency_graph()


def _offending(graph: dict[str, set[str]], sources: tuple[str, ...],
               forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {
        name: sorted(m for m in reachable(graph, name) if in_layer(m, forbidden))
        for name in graph if in_layer(name, sources)
    }
    return {name: mods for name, mods in found.items() if mods}


def test_the_core_reaches_no_engine_simulator_pipeline_or_cli(dependencies) -> None:
    """A policy, the CHT or a workload runs the same inside the simulator and inside vLLM or
    SGLang: nothing in them may depend on either side (by import or by a name in a string)."""
    assert any(in_layer(name, CORE) for name in dependencies)
    offending = _offending(dependencies, CORE, ABOVE_THE_CORE)
    assert not offending, f"the core reaches an outer layer: {offending}"


def test_the_engines_are_a_leaf_below_the_pipeline_the_simulator_and_the_cli(
        dependencies) -> None:
    """An engine runner is called by the pipeline and the CLI and calls neither (nor the
    simulator: what both need, such as the cold-KV count, lives below them)."""
    assert any(in_layer(name, ("feather.engines",)) for name in dependencies)
    offending = _offending(dependencies, ("feather.engines",), ABOVE_THE_ENGINES)
    assert not offending, f"an engine module reaches an outer layer: {offending}"
