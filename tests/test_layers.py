"""The house's rules, read off the source: imports run one way, and a lane changes only through its methods.

Layers, bottom up: kernels, the environment table, the checkpoint and what it reads; the pool, the
model, the families; the store, then the prompt cache; the engine; on top the server, the bench, the
conformance kit and the command line. A module may import its own package and anything below it,
never above; and no set of modules may import each other round in a cycle, lazily or not.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from tfd.engine.lane import Lane

ROOT = Path(__file__).resolve().parent.parent
RANKS = {  # a package or top-level module, and its layer
    "tfd_kernels": 0, "tfd": 0, "tfd.assets": 0, "tfd._env": 0, "tfd.env_kinds": 0, "tfd.loading": 0,
    "tfd.chat": 0, "tfd.arguments": 0, "tfd.exit_status": 0, "tfd.env_needs": 0, "tfd.env_rows": 0,
    "tfd.quantization": 0,
    "tfd.env": 1, "tfd.env_docs": 1, "tfd.checkpoint": 1, "tfd.checkpoint_headers": 1,
    "tfd.pool": 2, "tfd.model": 3, "tfd.families": 4,
    "tfd.demo": 5, "tfd.shapes": 5, "tfd.store": 5,
    "tfd.models": 6, "tfd.cache": 6,
    "tfd.engine": 7,
    "tfd.train": 8, "tfd.generate": 8,
    "tfd.server": 9, "tfd.bench": 9, "tfd.conformance": 10, "tfd.cli": 11, "tfd.__main__": 12,
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] == "kernels":
        parts[0] = "tfd_kernels"
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Every module of ``tfd/`` and ``kernels/`` under ``root`` and the project modules it imports
    (at the top or inside a function; ``from package import module`` names the module)."""
    files = [*root.glob("tfd/**/*.py"), *root.glob("kernels/**/*.py")]
    modules = {module_name(path, root) for path in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        name = module_name(path, root)
        found = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    package = package[:len(package) - node.level + 1]
                    base = ".".join([*package, *([node.module] if node.module else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in modules else base)
        graph[name] = {target for target in found if target in modules}
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] == "tfd_kernels" else ".".join(parts[:2])


def upward(graph: Mapping[str, Iterable[str]], ranks: Mapping[str, int]) -> list[str]:
    """Imports from a layer into a higher one, and modules in no layer."""
    found = []
    for source, targets in graph.items():
        for target in targets:
            here, there = layer_of(source), layer_of(target)
            if here not in ranks or there not in ranks:
                found.append(f"{source} -> {target}: {here if here not in ranks else there} has no layer")
            elif here != there and ranks[here] < ranks[there]:
                found.append(f"{source} -> {target}")
    return sorted(found)


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Sets of modules that import each other round (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_imports_run_down_the_layers_and_never_round() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100 and "tfd.engine.stepper" in graph["tfd.engine.engine"]
    assert upward(graph, RANKS) == []
    assert cycles(graph) == []


def write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_an_upward_import_and_a_cycle_are_caught(tmp_path: Path) -> None:
    write(tmp_path, {
        "tfd/__init__.py": "", "tfd/engine/__init__.py": "", "tfd/server/__init__.py": "",
        "tfd/store/__init__.py": "", "kernels/gemm.py": "",
        "tfd/engine/engine.py": "def later():\n    from tfd.server import systemd\n",  # lazily, still up
        "tfd/server/systemd.py": "import tfd_kernels.gemm\nfrom tfd.engine import engine\n",
        "tfd/store/a.py": "from . import b\n", "tfd/store/b.py": "from tfd.store.a import x\n",
    })
    graph = import_graph(tmp_path)
    assert upward(graph, RANKS) == ["tfd.engine.engine -> tfd.server.systemd"]
    assert cycles(graph) == [["tfd.engine.engine", "tfd.server.systemd"], ["tfd.store.a", "tfd.store.b"]]
    assert upward({"tfd.nowhere": {"tfd.env"}}, RANKS) == ["tfd.nowhere -> tfd.env: tfd.nowhere has no layer"]


LANE_FIELDS = {field.name for field in attrs.fields(Lane)}


def lane_writes(path: Path, root: Path = ROOT) -> list[str]:
    """Where ``path`` (named from ``root``) assigns to (or grows in place) a field of a lane: a field
    of ``Lane`` on any expression whose text ends in a name with ``lane`` in it."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                targets += target.elts if isinstance(target, ast.Tuple) else [target]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("append", "extend", "clear", "pop", "insert", "remove"):
            targets = [node.func.value]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in LANE_FIELDS and \
                    re.search(r"lane\w*$", ast.unparse(target.value), re.IGNORECASE):
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(target)}"))
    return [line for _, line in sorted(found)]


def test_a_lanes_fields_change_only_in_its_own_module() -> None:
    files = [*ROOT.glob("tfd/**/*.py"), *ROOT.glob("tests/**/*.py")]
    found = [line for path in files if path != ROOT / "tfd/engine/lane.py" for line in lane_writes(path)]
    assert found == []


def test_a_lane_field_written_from_outside_is_caught(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def f(lane, work, other):\n    lane.position = 3\n    work.lane.generated.append(1)\n"
                       "    lane.cancel()\n    other.position = 1\n    self.position = 2\n"
                       "    each_lane.keep_points, x = (), 1\n")
    assert lane_writes(planted, tmp_path) == [
        "planted.py:2: lane.position", "planted.py:3: work.lane.generated",
        "planted.py:7: each_lane.keep_points"]
