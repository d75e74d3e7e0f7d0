"""Every engine module imports on its own, and the package's import graph (lazy imports included) has no cycle.

The graph is static (`ast`): an import anywhere in a module, at module level or inside a function, is an edge,
and importing `a.b.c` also imports the packages `a.b` and `a` (their `__init__` runs first), so those are edges
too. A lazy import hides a cycle from Python, not from this test.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ralph_ray import PROJECT_ROOT

sys.path.insert(0, str(Path(__file__).parent))
import import_alone  # noqa: E402

PACKAGE = "ralph_ray"
ROOT = PROJECT_ROOT / PACKAGE


def module_name(path: Path) -> str:
    """The dotted name of a module file of the package."""
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """The package's modules that importing `name` runs, by any import statement anywhere in its file."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names)  # `from pkg import module`
    edges = set()
    for target in targets:
        parts = target.split(".")
        for depth in range(1, len(parts) + 1):  # a.b.c runs a/__init__ and a/b/__init__ first
            candidate = ".".join(parts[:depth])
            if candidate in MODULES:
                edges.add(candidate)
    own_packages = {".".join(name.split(".")[:depth]) for depth in range(1, name.count(".") + 1)}
    return edges - own_packages - {name, PACKAGE}  # a module's own packages are loaded before it, not by it


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    return {name: imported(name, path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path a -> ... -> a, or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_lazy_and_package_imports(tmp_path: Path):
    # The checker itself: a lazy import inside a function and the package __init__ of a target are edges.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert f"{PACKAGE}.config" not in import_graph()[f"{PACKAGE}.harness"]
    lazy = import_graph()[f"{PACKAGE}.__main__"]
    assert f"{PACKAGE}.scaffold" in lazy  # imported inside a function


def test_the_package_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


MISSING = f"{PACKAGE}.no_such_module"  # checked beside the modules: its failure must be reported


@pytest.fixture(scope="module")
def fresh_imports() -> dict[str, str]:
    """Every module imported in its own process, forked from an interpreter that has loaded the heavy third-party
    packages and nothing of the package (tests/import_alone.py); the failure of each, or ""."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "import_alone.py"), *sorted(MODULES), MISSING],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=PROJECT_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_module_is_checked_alone_or_not_at_all(fresh_imports: dict[str, str]):
    # The checker reports a failing import with its traceback, and refuses to check in a process that has the
    # package loaded already (this one: pytest's conftest imported it).
    assert fresh_imports[MISSING].endswith(f"No module named '{MISSING}'\n")
    assert import_alone.check("json").startswith(f"the process already had {PACKAGE}, ")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports_on_its_own(name: str, fresh_imports: dict[str, str]):
    # A fresh process per module: an import that only works after some other module ran first fails here.
    assert fresh_imports[name] == "", f"`import {name}` in a fresh process failed:\n{fresh_imports[name]}"


def third_party_roots(name: str) -> set[str]:
    """Top-level packages outside this one that a module imports anywhere in its file (lazy imports included)."""
    roots = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots - {PACKAGE}


def reach(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every module of the package that importing `name` may run, itself included."""
    seen, stack = {name}, [name]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


# The boundaries docs/architecture.md promises: module -> package modules it must not reach, even lazily.
MUST_NOT_REACH = {
    "harness": {"*"},  # the trainer's only engine import: copied alone into the sandbox
    "front": {"*"},  # the score-against-cost front: the app imports it, so it must pull in nothing of the engine
    "finals": {"*"},  # the final training's winner rule: the app imports it too
    "liveness": {"*"},  # the staleness rule: the app and state.json's driver record import it
    "runner": {"kb", "campaign", "generations", "asyncrun", "search", "trials"},
    "sandbox": {"kb", "campaign", "generations", "asyncrun", "search", "trials"},
    "workdir": {"kb", "campaign", "generations", "asyncrun", "search", "trials"},
    "gate": {"kb", "campaign", "generations", "asyncrun", "search", "trials"},
    "tasks.base": {"config"},
    "tasks.folder": {"config"},
    "tasks.plugins": {"config"},
    "scoring": {"config"},
    "decision": {"kb"},
    "population": {"kb", "config"},
}
# Modules that must run without Ray installed (nothing they reach imports ray).
RAY_FREE = (
    "harness",
    "runner",
    "sandbox",
    "workdir",
    "gate",
    "tasks",
    "scoring",
    "kb",
    "sql",
    "history",
    "records",
    "decision",
    "population",
    "agents",
    "children",
    "control",
    "state",
    "report",
    "front",
    "finals",
)


@pytest.mark.parametrize("name", sorted(MUST_NOT_REACH))
def test_layer_boundaries_hold(name: str):
    graph = import_graph()
    reached = {module.removeprefix(f"{PACKAGE}.") for module in reach(graph, f"{PACKAGE}.{name}")} - {name}
    forbidden = MUST_NOT_REACH[name]
    bad = reached if "*" in forbidden else reached & forbidden
    assert not bad, f"{name} reaches {sorted(bad)}, which docs/architecture.md says it must not"


@pytest.mark.parametrize("name", RAY_FREE)
def test_ray_free_modules_never_import_ray(name: str):
    graph = import_graph()
    with_ray = sorted(m for m in reach(graph, f"{PACKAGE}.{name}") if "ray" in third_party_roots(m))
    assert not with_ray, f"{name} reaches {with_ray}, which import ray"
