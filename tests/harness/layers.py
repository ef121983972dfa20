"""The source tree's modules and their layers, as tests/test_layers.py checks them and as other tests
that place a module in its layer read them (test_container_handle.py): every nvc, nvc.rpc and nvc.hook
module read from its file, the imports of each (also those inside functions, except under ``if
TYPE_CHECKING:``), and the layers, bottom first."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = {"nvc": REPO / "nvc", "nvc.rpc": REPO / "rpc", "nvc.hook": REPO / "hook"}

# Each layer: modules, or packages standing for every module in them; the longest match wins
# (nvc.commands.cli, the program, and its setup commands, which drive nvc.hook's engine
# registration, sit above the commands it runs).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "base",
        frozenset(
            {"nvc", "nvc.errors", "nvc.records", "nvc.logger", "nvc.debuglog", "nvc.system", "nvc.config", "nvc.model"}
        ),
    ),
    ("discover", frozenset({"nvc.discover"})),
    ("plan", frozenset({"nvc.plan", "nvc.containerenv"})),
    ("apply", frozenset({"nvc.apply", "nvc.share"})),
    ("rpc", frozenset({"nvc.rpc"})),
    ("pipeline", frozenset({"nvc.pipeline"})),
    ("commands", frozenset({"nvc.commands", "nvc.cdi", "nvc.k8s"})),
    (
        "programs",
        frozenset(
            {"nvc.__main__", "nvc.commands.cli", "nvc.commands.engine_setup", "nvc.hook", "nvc.doctor", "nvc.exporter"}
        ),
    ),
)


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def placements(module: str) -> list[tuple[int, int]]:
    """(length of the matching entry, layer) for each LAYERS entry naming ``module`` or a package
    holding it (``nvc`` itself only as a module)."""
    return [
        (len(entry), i)
        for i, (_, entries) in enumerate(LAYERS)
        for entry in entries
        if module == entry or (entry != "nvc" and module.startswith(entry + "."))
    ]


def rank(module: str) -> int:
    """The layer of ``module``: its own entry, else its innermost package's."""
    return max(placements(module))[1]


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


# The layers below the programs: the modules that must not name another process by themselves.
BELOW_PROGRAMS = ("base", "discover", "plan", "apply", "rpc", "pipeline", "commands")
