"""The house keeps its layers: every hubgym module imports only its own room and the rooms below it, at module
level and inside functions alike, so no two rooms import each other (no circle) and the library never reaches up
into the app. The order is written here; a change to it is a design decision, made in this file."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "hubgym"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "files"),  # exceptions; atomic writes, hashes, modules from checked bytes
    ("schemas",),  # the wire format: Message, Task row, Rollout row
    ("tools",),  # tool functions, toolboxes, the sandbox
    ("verifiers",),  # the verifier contract, golden cases, reward helpers
    ("builders",),  # TaskBuilder, the registry by name, the built-in envs
    ("bridges",),  # env families from other packages (their builders and verifiers)
    ("hub",),  # hub backends, manifests, cards, the trust check, rollout repos
    ("envs",),  # opening any env: refs, pins, open_env, the data path, build, push, catalog
    ("mixture",),  # task streams over many env configs
    ("models",),  # model references, the tiny model, SmolLM2
    ("engines",),  # the Engine protocol, EngineSettings and make_engine, vLLM offline, OpenAI client, vllm serve
    ("rollout",),  # the agent loop, token records, the shard writer, the run, its report
    ("score", "stats"),  # re-scoring and replay; task difficulty across runs
    ("train", "cluster", "integrations"),  # GRPO on DeepSpeed; Ray; hubgym in TRL and verifiers
    ("conformance",),  # the checks behind `hubgym check`
    ("authoring",),  # `hubgym init` and `hubgym wrap`
    ("app", "viewer"),  # views, the main job; `hubgym view`
    ("cli", "__main__"),  # the `hubgym` command
]
"""Rooms, bottom first; a room may import the rooms of its own line and of the lines above it."""

LEVEL = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, hubgym module) of every import in the file: module level, in functions, under TYPE_CHECKING."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
            found += [(node.lineno, name) for name in submodules or [node.module]]  # `from pkg import module`
    return [(line, name) for line, name in found if name.startswith("hubgym.")]


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_room_is_in_the_layer_order():
    rooms = {room_of(module_of(path)) for path in MODULES} - {"__init__"}
    assert rooms <= set(LEVEL), f"rooms missing from LAYERS: {sorted(rooms - set(LEVEL))}"
    assert {p.name for p in PACKAGE.glob("*.py")} == {"__init__.py", "__main__.py", "errors.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_reaches_up_or_sideways_into_a_room_above(path):
    room = room_of(module_of(path))
    if room == "__init__":  # the package's own lazy re-exports
        return
    upward = [f"line {line}: {name} ({room_of(name)})" for line, name in imports(path)
              if room_of(name) in LEVEL and LEVEL[room_of(name)] > LEVEL[room]]
    assert upward == [], f"{module_of(path)} (room {room!r}) imports rooms above it: {upward}"


@pytest.mark.slow
def test_no_module_imports_itself_back_through_others():
    """The import graph of hubgym's modules (every import, in functions too) has no circle: a module that needs
    another's names below it never has that module need its own."""
    modules = {module_of(path): path for path in MODULES}

    def target(name: str) -> str | None:  # the module an import names (a name imported from one is that one)
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {module: {t for _, name in imports(path) if (t := target(name)) not in (None, "hubgym", module)}
             for module, path in modules.items()}
    circles = [circle for circle in _circles(graph) if len(circle) > 1]
    assert circles == [], f"import circles: {circles}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


@pytest.mark.parametrize("package", sorted({module_of(p) for p in PACKAGE.rglob("__init__.py")
                                            if "templates" not in p.parts}))
def test_every_name_a_package_exports_resolves(package):
    """A lazy export that names a module the name moved out of fails on first use, far from its cause."""
    module = importlib.import_module(package)
    missing = [name for name in getattr(module, "__all__", []) if not hasattr(module, name)]
    assert missing == [], f"{package} exports names it cannot give: {missing}"
