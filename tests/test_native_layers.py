"""native/shim/ (the sharing shim's C files) has layers too, and no circle between its files.

A module is a file's stem: ``x.c`` and ``x.h`` count as one module ``x`` (a header says what its
``.c`` offers); file names are unique across the shim's folders, which include each other by their
path under native/shim/ (``#include "base/ground.h"``). Two graphs between modules are checked: what each includes (its ``#include "..."``
lines), and what each uses at link time (every symbol a compiled file needs that another file
defines: calls, data, and addresses taken, as resolve.c takes every wrapper's). Neither may have a
circle. The ground (``ground``: log, failure, clock, state) depends on no other module of the shim;
the top (``shim``: fork handling) is what no other module depends on. ``cuda_abi.h`` and
``nvml_abi.h`` declare the driver's ABI, not the shim's: the fake driver builds against them too.

The folders are the shim's floors, bottom first (``FLOORS``): a module depends only on modules of its
own folder or of the folders below it, in both graphs.
"""

from __future__ import annotations

import os
import re
import subprocess
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NATIVE = REPO / "native"
SHIM = NATIVE / "shim"
# The shim's folders, bottom first: the ground and the driver's tables; the scheduling machinery;
# this process's start and devices; memory accounting; the exported entry points and the top.
FLOORS = ("base", "scheduling", "process", "accounting", "entry")
ABI = frozenset({"cuda_abi", "nvml_abi"})
GROUND = "ground"
TOP = "shim"
MAX_LINES = 600

Graph = dict[str, set[str]]


def include_graph(folder: Path) -> Graph:
    """Module -> the other modules its ``.c`` and ``.h`` include (the files of ``folder`` and its
    sub-folders)."""
    sources = sorted(folder.rglob("*.[ch]"))
    graph: Graph = {path.stem: set() for path in sources}
    for path in sources:
        named = re.findall(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', path.read_text(), re.MULTILINE)
        graph[path.stem] |= {Path(name).stem for name in named if Path(name).stem in graph} - {path.stem}
    return graph


Objects = dict[str, tuple[set[str], set[str]]]


def compile_objects(folder: Path, build: Path) -> Objects:
    """Module -> the (defined, undefined) global symbols of its compiled ``.c`` (includes named from
    ``folder``, as native/Makefile compiles the shim)."""
    found: Objects = {}
    for source in sorted(folder.rglob("*.c")):
        obj = build / f"{source.stem}.o"
        subprocess.run(
            [os.environ.get("CC", "cc"), "-c", "-O0", "-fPIC", "-w", "-iquote", ".", str(source), "-o", str(obj)],
            cwd=folder,
            check=True,
        )
        defined: set[str] = set()
        undefined: set[str] = set()
        for line in subprocess.run(
            ["nm", "-P", str(obj)], check=True, capture_output=True, text=True
        ).stdout.splitlines():
            name, kind = line.split()[:2]
            if kind == "U":
                undefined.add(name)
            elif kind.isupper():
                defined.add(name)
        found[source.stem] = (defined, undefined)
    return found


def _owners(objects: Objects) -> dict[str, str]:
    return {symbol: module for module, (defined, _) in objects.items() for symbol in defined}


def link_graph(objects: Objects) -> Graph:
    """Module -> the other modules whose symbols its compiled ``.c`` uses."""
    owner = _owners(objects)
    return {module: {owner[s] for s in needed if s in owner} - {module} for module, (_, needed) in objects.items()}


def headers_not_included(folder: Path, objects: Objects) -> list[str]:
    """Each shim symbol (nvc_*) a file uses from a module with a header that the file does not
    include itself (from its .c or its own .h): "a file includes the headers of what it uses"."""
    owner, includes = _owners(objects), include_graph(folder)
    headers = {p.stem for p in folder.rglob("*.h")}
    return [
        f"{module}.c uses {symbol} ({owner[symbol]}.h)"
        for module, (_, needed) in sorted(objects.items())
        for symbol in sorted(needed)
        if symbol.startswith("nvc_")
        and symbol in owner
        and owner[symbol] in headers
        and owner[symbol] not in includes[module] | {module}
    ]


def cycle(graph: Graph) -> list[str]:
    """One circle of ``graph`` (its modules, the first again at the end), or [] when it has none."""
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        return list(error.args[1])
    return []


def dependents(graph: Graph, module: str) -> list[str]:
    return sorted(m for m, deps in graph.items() if module in deps)


def folders(folder: Path) -> dict[str, str]:
    """Module -> the folder (under ``folder``) its files are in."""
    return {path.stem: str(path.parent.relative_to(folder)) for path in folder.rglob("*.[ch]")}


def against_the_floors(graph: Graph, placed: dict[str, str], floors: tuple[str, ...]) -> list[str]:
    """Each dependency of graph on a module of a folder above the depending module's."""
    rank = {floor: i for i, floor in enumerate(floors)}
    return sorted(
        f"{placed[module]}/{module} -> {placed[dep]}/{dep}"
        for module, deps in graph.items()
        for dep in deps
        if rank[placed[dep]] > rank[placed[module]]
    )


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> Objects:
    return compile_objects(SHIM, tmp_path_factory.mktemp("native-objects"))


def test_file_names_are_unique_across_the_folders() -> None:
    """A module is its stem: two files of one name in two folders would be one module here."""
    names = [path.name for path in SHIM.rglob("*.[ch]")]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []


def test_the_folders_are_the_floors() -> None:
    assert sorted({path.parent.name for path in SHIM.rglob("*.[ch]")}) == sorted(FLOORS)
    assert sorted(path.name for path in SHIM.iterdir()) == sorted(FLOORS)
    assert folders(SHIM)[GROUND] == FLOORS[0] and folders(SHIM)[TOP] == FLOORS[-1]


def test_a_folder_depends_only_on_itself_and_the_folders_below(objects: Objects) -> None:
    placed = folders(SHIM)
    assert against_the_floors(include_graph(SHIM), placed, FLOORS) == []
    assert against_the_floors(link_graph(objects), placed, FLOORS) == []


def test_no_include_circle() -> None:
    assert cycle(include_graph(SHIM)) == []


def test_no_link_circle(objects: Objects) -> None:
    links = link_graph(objects)
    assert set(links) == {p.stem for p in SHIM.rglob("*.c")}
    assert {"region", GROUND} <= links["memory"]  # the graph is the shim's, read from its objects
    assert cycle(links) == []


def test_the_ground_depends_on_nothing_of_the_shim(objects: Objects) -> None:
    assert include_graph(SHIM)[GROUND] <= ABI
    assert link_graph(objects)[GROUND] == set()


def test_nothing_depends_on_the_top(objects: Objects) -> None:
    assert dependents(include_graph(SHIM), TOP) == []
    assert dependents(link_graph(objects), TOP) == []


def test_the_top_forks_every_file_with_a_fork_hook(objects: Objects) -> None:
    hooks = {s for defined, _ in objects.values() for s in defined if re.fullmatch(r"nvc_\w+_fork", s)}
    assert len(hooks) > 5
    assert hooks - objects[TOP][1] == set()


def test_a_file_includes_the_headers_of_what_it_uses(objects: Objects) -> None:
    assert headers_not_included(SHIM, objects) == []


def readme_order(readme: str) -> list[str]:
    """The shim's modules in the order native/README.md's table of files lists them (bottom first;
    the hook client's rows, ``client/...``, and the driver helper's, ``driver/...``, are not the shim's)."""
    table = readme.split("## Files\n", 1)[1].split("\n## ", 1)[0]
    order: list[str] = []
    for row in re.findall(r"^\| (`[^|]+) \|", table, re.MULTILINE):  # not "each `X.h`"
        for name in re.findall(r"`([\w./]+\.[ch])`", row):
            if not name.startswith(("client/", "driver/")) and Path(name).stem not in order:
                order.append(Path(name).stem)
    return order


def against_the_order(graph: Graph, order: list[str]) -> list[str]:
    """Each dependency of graph on a module listed after (or not before) the one depending on it."""
    rank = {module: i for i, module in enumerate(order)}
    return sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if rank.get(dep, len(order)) >= rank.get(module, -1)
    )


def test_the_readme_lists_the_files_bottom_first(objects: Objects) -> None:
    """native/README.md's table names every file by its path under shim/, each after all it includes
    and calls."""
    readme = (NATIVE / "README.md").read_text()
    order = readme_order(readme)
    assert sorted(order) == sorted({p.stem for p in SHIM.rglob("*.[ch]")})
    assert order[:3] == ["cuda_abi", "nvml_abi", GROUND] and order[-1] == TOP
    named = set(re.findall(r"`([\w/]+\.[ch])`", readme.split("## Files\n", 1)[1].split("\n## ", 1)[0]))
    assert sorted(str(p.relative_to(SHIM)) for p in SHIM.rglob("*.[ch]") if str(p.relative_to(SHIM)) not in named) == []
    assert against_the_order(include_graph(SHIM), order) == []
    assert against_the_order(link_graph(objects), order) == []
    assert against_the_order({"ground": {"shim"}}, order) == ["ground -> shim"]


def test_the_checks_see_circles_a_ground_that_calls_up_and_a_header_missing(tmp_path: Path) -> None:
    """The checkers themselves, on planted files: a circle of includes; a circle of calls between
    files that include no header of each other (only the link graph sees it); a ground file that
    calls a file above it; a file using another's function without including its header; a lower
    folder's file that includes and calls an upper folder's."""
    (tmp_path / "a.h").write_text('#include "b.h"\nvoid a(void);\n')
    (tmp_path / "b.h").write_text('#include "a.h"\nvoid b(void);\n')
    (tmp_path / "up.c").write_text("void down(void);\nvoid up(void) { down(); }\n")
    (tmp_path / "down.c").write_text("void up(void);\nvoid down(void) { up(); }\n")
    (tmp_path / "ground.c").write_text("void top(void);\nvoid nvc_log(void) { top(); }\n")
    (tmp_path / "top.c").write_text('#include "ground.h"\nvoid nvc_top(void) { nvc_log(); }\nvoid top(void) {}\n')
    (tmp_path / "ground.h").write_text("void nvc_log(void);\n")
    (tmp_path / "user.c").write_text("void nvc_top(void);\nvoid user(void) { nvc_top(); }\n")
    (tmp_path / "build").mkdir()
    objects = compile_objects(tmp_path, tmp_path / "build")
    includes, links = include_graph(tmp_path), link_graph(objects)
    assert sorted(cycle(includes)) == ["a", "a", "b"]
    assert includes["up"] == includes["down"] == set()
    assert links == {"up": {"down"}, "down": {"up"}, "ground": {"top"}, "top": {"ground"}, "user": {"top"}}
    assert sorted(set(cycle(links))) in (["down", "up"], ["ground", "top"])
    assert dependents(links, "top") == ["ground", "user"]
    assert headers_not_included(tmp_path, objects) == []  # top has no header: nothing to include
    (tmp_path / "top.h").write_text("void nvc_top(void);\n")
    assert headers_not_included(tmp_path, objects) == ["user.c uses nvc_top (top.h)"]
    assert cycle({"a": {"b"}, "b": set()}) == []
    placed = dict.fromkeys(links, "low") | {"top": "high"}
    assert against_the_floors(links, placed, ("low", "high")) == ["low/ground -> high/top", "low/user -> high/top"]
    assert against_the_floors(links, placed, ("high", "low")) == ["high/top -> low/ground"]
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "roof.h").write_text('#include "low/cellar.h"\n')
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "cellar.h").write_text('#include "high/roof.h"\n')
    assert folders(tmp_path)["roof"] == "high" and folders(tmp_path)["cellar"] == "low"
    assert include_graph(tmp_path)["cellar"] == {"roof"} and include_graph(tmp_path)["roof"] == {"cellar"}


def first_comment(path: Path) -> str:
    found = re.match(r"\s*/\*(.*?)\*/", path.read_text(), re.DOTALL)
    return found.group(1) if found else ""


def module_sizes() -> dict[str, int]:
    """Lines of each C file of native/ (the shim and the hook client), largest first."""
    files = sorted(NATIVE.rglob("*.[ch]"))
    sizes = {str(p.relative_to(NATIVE)): len(p.read_text().splitlines()) for p in files}
    return dict(sorted(sizes.items(), key=lambda item: -item[1]))


def test_c_files_are_at_most_600_lines_unless_they_say_why() -> None:
    """A file over 600 lines says in its first comment why it must be one piece; the list of sizes is
    printed (pytest -s) for the record."""
    sizes = module_sizes()
    print("\n".join(f"{lines:5d} native/{name}" for name, lines in sizes.items()))
    assert sizes["shim/accounting/memory.c"] > 0
    assert {
        name: lines
        for name, lines in sizes.items()
        if lines > MAX_LINES and "one piece" not in first_comment(NATIVE / name)
    } == {}
