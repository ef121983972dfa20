"""The source tree's imports go down the pipeline, and never in a circle.

Read from the source files (every import, also those inside functions, except under
``if TYPE_CHECKING:``), so a lazy import cannot hide an upward dependency or a cycle. The
layers, bottom first: shared basics; discovery (what the host has); planning (pure: what a
container gets); applying it (mounts, ldconfig, cgroups, sharing files); the privileged
helpers (``nvc.rpc``), which run discovery and apply steps for the layers above; the commands
that drive the pipeline; and the programs (``nvc-py``'s CLI, ``nvc.hook``). A module may
import its own layer or a lower one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = {"nvc": REPO / "nvc", "nvc.rpc": REPO / "rpc", "nvc.hook": REPO / "hook"}

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"nvc", "nvc.errors", "nvc.logger", "nvc.debuglog", "nvc.untrusted", "nvc.quickexit",
                        "nvc.loaderenv", "nvc.syscalls", "nvc.devices", "nvc.capabilities", "nvc.options",
                        "nvc.config", "nvc.rootpath"})),
    ("discover", frozenset({"nvc.procfs", "nvc.ldcache", "nvc.elf", "nvc.driver", "nvc.nodes", "nvc.inventory",
                            "nvc.kmods"})),
    ("plan", frozenset({"nvc.selection", "nvc.requirements", "nvc.devfilter", "nvc.mountplan"})),
    ("apply", frozenset({"nvc.bpf", "nvc.cgroups", "nvc.fdmount", "nvc.rootfs", "nvc.ldconfig", "nvc.apply",
                         "nvc.share", "nvc.shareregion", "nvc.sharesched"})),
    ("rpc", frozenset({"nvc.rpc", "nvc.rpc.protocol", "nvc.rpc.helper", "nvc.rpc.confine", "nvc.rpc.driver_service",
                       "nvc.rpc.container_service"})),
    ("commands", frozenset({"nvc.configure", "nvc.listing", "nvc.cdi", "nvc.devnodes", "nvc.infoformat",
                            "nvc.sharestatus"})),
    ("programs", frozenset({"nvc.__main__", "nvc.cli"})),
)


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


MODULES = _modules()


def _rank(module: str) -> int:
    if module == "nvc.hook" or module.startswith("nvc.hook."):
        return len(LAYERS) - 1  # the hook's programs, beside nvc-py's
    return next(i for i, (_, members) in enumerate(LAYERS) if module in members)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in (getattr(test, "id", None), getattr(test, "attr", None))


def imports(path: Path) -> set[str]:
    """The nvc modules ``path`` imports at run time, wherever the import statement stands."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            for other in node.orelse:  # type: ignore[attr-defined]
                visit(other)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in found if name in MODULES}


GRAPH = {module: imports(path) - {module} for module, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if not m.startswith("nvc.hook") and not any(m in s for _, s in LAYERS)] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    upward = sorted(f"{dep} ({LAYERS[_rank(dep)][0]})" for dep in GRAPH[module] if _rank(dep) > _rank(module))
    assert upward == [], f"{module} ({LAYERS[_rank(module)][0]}) imports a higher layer"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_circles() -> None:
    assert _cycles(GRAPH) == []


def test_the_check_sees_lazy_imports_and_circles(tmp_path: Path) -> None:
    """The checker itself: an import inside a function counts, a TYPE_CHECKING one does not."""
    source = tmp_path / "sample.py"
    source.write_text("from typing import TYPE_CHECKING\nfrom nvc import errors\nif TYPE_CHECKING:\n"
                      "    from nvc.configure import plan\nelse:\n    import nvc.cli\n"
                      "def f():\n    from nvc.rpc import helper\n    import nvc.apply\n")
    assert imports(source) == {"nvc.errors", "nvc.cli", "nvc.rpc.helper", "nvc.apply"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
