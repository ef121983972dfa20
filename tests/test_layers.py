"""The source tree's imports go down the pipeline, and never in a circle.

Read from the source files (every import, also those inside functions, except under
``if TYPE_CHECKING:``), so a lazy import cannot hide an upward dependency or a cycle. The
layers, bottom first: shared basics; discovery (what the host has); planning (pure: what a
container gets); applying it (mounts, ldconfig, cgroups, sharing files); the privileged
helpers (``nvc.rpc``), which carry discovery and apply calls for the layers above; the pipeline
(``nvc.pipeline``), a container start's steps; the commands that drive it; and the programs
(``nvc-py``'s CLI, ``nvc.hook``). A module may import its own layer or a lower one. What a container may ask (its env's variables, the device
plugin's volume mounts) is named in one module only, the contract ``nvc.containerenv``; the
container's process is read through ``/proc/PID`` by one module only, its handle
``nvc.apply.container``. And no module grows past a size a maintainer reads whole (450 lines of
Python, 600 of C) without saying why.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from harness.layers import BELOW_PROGRAMS, GRAPH, LAYERS, MODULES, REPO, imports, placements, rank


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if not placements(m)] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    upward = sorted(f"{dep} ({LAYERS[rank(dep)][0]})" for dep in GRAPH[module] if rank(dep) > rank(module))
    assert upward == [], f"{module} ({LAYERS[rank(module)][0]}) imports a higher layer"


# nvc.hook's three packages, bottom first: the OCI side (hook, CDI hooks, runtime wrapper), the hook
# server that runs its calls, the engines' registration that sets both up. nvc.hook.program, the
# nvc-py-hook program, sits above the first two.
HOOK_PACKAGES = ("nvc.hook.oci", "nvc.hook.server", "nvc.hook.setup")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(HOOK_PACKAGES)))
def test_hook_packages_import_down_and_no_private_names(module: str) -> None:
    """A hook package imports only the ones below it, and no ``_private`` name of another package."""
    own = next(i for i, package in enumerate(HOOK_PACKAGES) if module.startswith(package + ".") or module == package)
    above = [
        dep
        for dep in GRAPH[module]
        for i, package in enumerate(HOOK_PACKAGES)
        if i > own and (dep == package or dep.startswith(package + "."))
    ]
    assert above == [], f"{module} imports a hook package above its own"
    private = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(MODULES[module].read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("nvc.hook.")
        and not node.module.startswith(HOOK_PACKAGES[own])
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == [], f"{module} imports another hook package's private names"


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
    source.write_text(
        "from typing import TYPE_CHECKING\nfrom nvc import errors\nif TYPE_CHECKING:\n"
        "    from nvc.pipeline.configure import plan\nelse:\n    import nvc.commands.cli\n"
        "def f():\n    from nvc.rpc import helper\n    import nvc.apply.applier\n"
    )
    assert imports(source) == {"nvc.errors", "nvc.commands.cli", "nvc.rpc.helper", "nvc.apply.applier"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_installed_package_is_the_source_tree() -> None:
    """Module for module: an install after a module moved keeps no copy of it at its old place."""
    import nvc

    installed = Path(nvc.__file__).parent
    names = {
        ".".join(("nvc", *p.relative_to(installed).with_suffix("").parts)).removesuffix(".__init__")
        for p in installed.rglob("*.py")
    }
    assert names == set(MODULES)


def test_the_core_never_imports_the_helpers_or_the_programs() -> None:
    """nvc's basics, discover, plan, apply and share name nothing of nvc.rpc, nvc.pipeline,
    nvc.commands or nvc.hook (the helpers carry the core's calls; the pipeline, the commands and the
    programs drive it)."""
    outer = ("nvc.rpc", "nvc.pipeline", "nvc.commands", "nvc.hook")
    core = [m for m in MODULES if LAYERS[rank(m)][0] in ("base", "discover", "plan", "apply")]
    assert "nvc.apply.sharefiles" in core and "nvc.plan.mountplan" in core and "nvc.containerenv" in core
    assert (
        sorted(
            f"{m} -> {dep}" for m in core for dep in GRAPH[m] if any(dep == o or dep.startswith(o + ".") for o in outer)
        )
        == []
    )


def test_the_contract_imports_nothing_of_the_plan() -> None:
    """nvc.containerenv names and writes the contract; the plan builds its records from it
    (nvc.plan.fromenv): within their layer the arrows go one way."""
    contract = [m for m in MODULES if m == "nvc.containerenv" or m.startswith("nvc.containerenv.")]
    assert sorted(f"{m} -> {dep}" for m in contract for dep in GRAPH[m] if dep.startswith("nvc.plan")) == []


# What a container may ask, by name: the NVIDIA_* variables (and legacy images' CUDA_VERSION), the
# sharing ones (NVC_SHARE_*, HAMi's CUDA_DEVICE_*) and the device plugin's volume-mount paths.
CONTRACT = "nvc.containerenv"
_CONTRACT_NAMES = re.compile(
    r"(?<![A-Za-z0-9_])(?:NVIDIA_[A-Z]|NVC_SHARE_[A-Z]|CUDA_DEVICE_[A-Z]|CUDA_VERSION)|"
    r"nvidia-container-devices"
)


def contract_names(path: Path) -> list[str]:
    """The string literals of ``path`` (f-strings' parts too, docstrings not) that name a variable or
    a volume path of the container environment contract, with their line."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and _CONTRACT_NAMES.search(node.value)
    ]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != CONTRACT and not m.startswith(CONTRACT + ".")))
def test_only_the_contract_names_what_a_container_may_ask(module: str) -> None:
    """nvc.containerenv is the one reader (and writer) of the container environment: no other module
    spells a variable name or a volume path of it, so none can read or write it on its own (they
    import the names and the readers from there)."""
    assert contract_names(MODULES[module]) == []


def test_the_contract_check_sees_every_literal(tmp_path: Path) -> None:
    """The checker itself: plain and f-string literals count, wherever they stand; docstrings, names
    that merely end in one (NVML_BRAND_NVIDIA_…) and the contract's own module names do not."""
    source = tmp_path / "sample.py"
    source.write_text('''"""Reads NVIDIA_VISIBLE_DEVICES."""
def f(env, uuid):
    """And NVC_SHARE_COMPUTE."""
    brand = "NVML_BRAND_NVIDIA_RTX"
    return env.get("NVIDIA_VISIBLE_DEVICES"), f"NVC_SHARE_MEMORY_LIMIT_{uuid}", {"CUDA_VERSION": 1}, \\
        "/var/run/nvidia-container-devices/" + uuid, f"{uuid}CUDA_DEVICE_SM_LIMIT", "nvc.containerenv"
''')
    assert [line.split(": ", 1)[1] for line in contract_names(source)] == [
        "'NVIDIA_VISIBLE_DEVICES'",
        "'NVC_SHARE_MEMORY_LIMIT_'",
        "'CUDA_VERSION'",
        "'/var/run/nvidia-container-devices/'",
        "'CUDA_DEVICE_SM_LIMIT'",
    ]
    assert contract_names(MODULES[CONTRACT]) != []  # the contract's own names are seen


# Module size: a maintainer reads a module whole, so none grows past these unless its module
# docstring (a C file's leading comment) has a paragraph starting "One piece:" that says why it
# must stay whole. Generated code (DO NOT EDIT in its first lines: nvc/k8s/api_pb2*.py) is not counted.
# Held to it: nvc's modules, the shim (native/) and the fake driver the tests build (tests/fakedriver/).
# Python is counted as ruff formats it (make lint), which spreads a long call over a line an argument.
MAX_PYTHON_LINES = 520
MAX_C_LINES = 600
ONE_PIECE = "One piece:"


def _leading_text(path: Path) -> str:
    """A Python module's docstring, or a C file's leading comment (its first /* ... */)."""
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text, str(path))) or ""
    start = text.find("/*")
    return text[start : text.find("*/", start)] if start != -1 else ""


def oversized(paths: list[Path], limit: int) -> list[str]:
    """``path: N lines`` for each hand-written file of ``paths`` over ``limit`` lines that does not
    say why it must be one piece."""
    found = []
    for path in paths:
        text = path.read_text()
        if "DO NOT EDIT" in "".join(text.splitlines(keepends=True)[:3]):
            continue
        lines = len(text.splitlines())
        if lines > limit and not re.search(rf"(?m)^\W*{ONE_PIECE} \S", _leading_text(path)):
            found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {lines} lines")
    return found


FAKE_DRIVER = REPO / "tests" / "fakedriver"


def _over_the_limits() -> list[str]:
    return (
        oversized(sorted(MODULES.values()), MAX_PYTHON_LINES)
        + oversized(sorted([*REPO.glob("tests/test_*.py"), *REPO.glob("tests/harness/*.py")]), MAX_PYTHON_LINES)
        + oversized(sorted(FAKE_DRIVER.rglob("*.py")), MAX_PYTHON_LINES)
        + oversized(sorted((REPO / "native").rglob("*.c")), MAX_C_LINES)
        + oversized(sorted(FAKE_DRIVER.rglob("*.c")), MAX_C_LINES)
    )


def test_no_module_is_over_its_size() -> None:
    assert _over_the_limits() == []


def test_the_size_check_counts_lines_and_reads_the_reason(tmp_path: Path) -> None:
    """The checker itself: one line over is found, at the limit is not; a "One piece:" paragraph
    (in a Python docstring, a C file's leading comment) lets a file be longer, the words elsewhere do
    not; generated code is not counted."""
    body = ["x = 1\n"] * MAX_PYTHON_LINES
    cases = {
        "at.py": ['"""At the limit."""\n', *body[1:]],
        "over.py": ['"""One line over."""\n', *body],
        "reason.py": ['"""Long.\n', "\n", "One piece: the reason.\n", '"""\n', *body],
        "comment.py": ['"""Long."""\n', "# One piece: not in the docstring\n", *body],
        "generated.py": ["# Generated by a compiler.  DO NOT EDIT!\n", *body],
        "over.c": ["/* One line over. */\n", *["int x;\n"] * MAX_C_LINES],
        "reason.c": ["/* Long.\n", " *\n", " * One piece: the reason.\n", " */\n", *["int x;\n"] * MAX_C_LINES],
    }
    for name, lines in cases.items():
        (tmp_path / name).write_text("".join(lines))
    assert oversized(sorted(tmp_path.glob("*.py")), MAX_PYTHON_LINES) == [
        f"{tmp_path}/comment.py: {MAX_PYTHON_LINES + 2} lines",
        f"{tmp_path}/over.py: {MAX_PYTHON_LINES + 1} lines",
    ]
    assert oversized(sorted(tmp_path.glob("*.c")), MAX_C_LINES) == [f"{tmp_path}/over.c: {MAX_C_LINES + 1} lines"]


# The container's process, read through /proc/PID by its handle only (nvc.apply.container), which
# resolves the pid once into descriptors that keep naming that process: a pid looked up again may
# name another process by then. The programs (the hook's own checks of its caller, doctor) are not
# held to it: they run no step of a configure.
HANDLE = "nvc.apply.container"


def _pid_like(node: ast.AST) -> bool:
    """A name or attribute ``pid``, ``*_pid`` or ``x.pid``."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "pid" or name.endswith("_pid")


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _builds_proc_path(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr):  # f"/proc/{pid}", f"{proc}/{pid}"
        return any(
            text is not None
            and isinstance(value, ast.FormattedValue)
            and (text.endswith("/proc/") or text.endswith("/") and _pid_like(value.value))
            for text, value in ((_literal(a), b) for a, b in itertools.pairwise(node.values))
        )
    if isinstance(node, ast.BinOp):  # "/proc/" + pid, "/proc/%d" % pid, base + "/" + pid, Path("/proc") / pid
        left = _literal(node.left) or ""
        if isinstance(node.op, ast.Add):
            return left.endswith("/proc/") or left.endswith("/") and _pid_like(node.right)
        if isinstance(node.op, ast.Mod):
            return "/proc/%" in left
        if isinstance(node.op, ast.Div) and isinstance(node.left, ast.Call):
            return any(_literal(arg) in ("/proc", "/proc/") for arg in node.left.args) and _literal(node.right) is None
        return False
    if isinstance(node, ast.Call):  # "/proc/{}".format(pid), os.path.join("/proc", pid), Path("/proc", pid)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format" and "/proc/{" in (_literal(func.value) or ""):
            return True
        return (
            len(node.args) > 1
            and _literal(node.args[0]) in ("/proc", "/proc/")
            and any(_literal(arg) is None for arg in node.args[1:])
        )
    return False


def proc_paths(path: Path) -> list[str]:
    """The expressions of ``path`` that build a path of a process under /proc from a value, with
    their line: a value right after a literal ``/proc/`` (f-string, ``+``, ``%``, ``.format``),
    ``/proc`` joined with a value (os.path.join, Path, ``/``), a pid right after a ``/``
    (``f"{proc}/{pid}"``). Literal paths (/proc/self/..., /proc/driver/...) are not counted."""
    tree = ast.parse(path.read_text(), str(path))
    found = sorted((node.lineno, ast.unparse(node)) for node in ast.walk(tree) if _builds_proc_path(node))
    return [f"{line}: {text}" for line, text in found]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != HANDLE and LAYERS[rank(m)][0] in BELOW_PROGRAMS))
def test_only_the_handle_reads_proc_of_the_container(module: str) -> None:
    """Below the programs, nothing formats /proc/PID: every step is given the container's handle
    (its descriptors: to the container helper over its socket), resolved once at the request's check."""
    assert proc_paths(MODULES[module]) == []


def test_the_proc_check_sees_every_way_of_building_the_path(tmp_path: Path) -> None:
    """The checker itself: a pid put into a /proc path however it is spelt counts; /proc/self, fixed
    /proc files and a /proc path of a literal do not."""
    source = tmp_path / "sample.py"
    source.write_text("""import os
from pathlib import Path
def f(pid, plan, proc, name):
    os.open(f"/proc/{pid}/ns/mnt", 0)
    os.stat(f"/proc/{plan.pid}")
    open(f"{proc}/{pid}/{name}")
    open("/proc/" + str(pid))
    open("/proc/%d/cgroup" % pid)
    open("/proc/{}/root".format(pid))
    os.path.join("/proc", str(pid), "stat")
    Path("/proc") / str(pid)
    open("/proc/self/mountinfo"), open(f"/proc/self/fd/{name}"), Path("/proc") / "driver/nvidia"
    os.path.join("/proc", "devices"), open("/proc/driver/nvidia/version")
""")
    assert [line.split(": ", 1)[0] for line in proc_paths(source)] == ["4", "5", "6", "7", "8", "9", "10", "11"]
    assert proc_paths(MODULES[HANDLE]) != []  # the handle's own reading is seen


# docs/architecture.md: the maintainer's one page, kept true here. Its tables are read by their
# section's heading; a name in backquotes is a module, a package, a folder or a file.
ARCHITECTURE = REPO / "docs" / "architecture.md"


def doc_table(heading: str, text: str | None = None) -> dict[str, list[str]]:
    """The table under ``## heading`` of the architecture page: first cell -> the other cells."""
    text = ARCHITECTURE.read_text() if text is None else text
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows[2:]}


def quoted(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def test_the_architecture_page_shows_the_layers() -> None:
    """Its layer table is LAYERS, entry for entry: a module placed here is placed there."""
    table = doc_table("Layers")
    assert {layer: quoted(cells[0]) for layer, cells in table.items()} == {
        name: set(entries) for name, entries in LAYERS
    }


def test_the_architecture_page_shows_what_each_process_keeps() -> None:
    """Its process table is nvc.system.confinement's: the capabilities each process keeps, its root and its
    identity, row for row."""
    from nvc.system import confinement

    def kept(row: confinement.Confinement) -> str:
        return "the server's" if row.permitted is None else ", ".join(row.permitted) or "none"

    table = doc_table("The processes and what they keep")
    assert {name: cells[:3] for name, cells in table.items()} == {
        row.process: [kept(row), row.root, row.identity] for row in confinement.TABLE
    }


def test_the_architecture_page_places_every_folder_and_native_file() -> None:
    """Every Python package folder and native/client are in its folder table; every C file of the shim
    is in the shim's table."""
    folders = set().union(*(quoted(name) for name in doc_table("Where each file sits")))
    packages = {
        f"{path.parent.relative_to(REPO)}/"
        for path in REPO.glob("*/**/__init__.py")
        if path.parent.relative_to(REPO).parts[0] in ("nvc", "rpc", "hook") and path.parent != REPO / "nvc"
    }
    assert sorted((packages | {"native/", "native/client/"}) - folders) == []
    shim = set().union(*(quoted(name) for name in doc_table("The sharing shim (native/)")))
    assert sorted({path.name for path in (REPO / "native").glob("*.c")} - shim) == []


def test_the_page_check_reads_its_tables() -> None:
    """The checker itself: the rows under a heading, up to the next one; backquoted names only."""
    text = (
        "# T\n\n## A\n\n| x | y |\n|---|---|\n| one | `a`, `b` and c |\n| two | none |\n\n## B\n\n| z |\n|---|\n| q |\n"
    )
    table = doc_table("A", text)
    assert table == {"one": ["`a`, `b` and c"], "two": ["none"]}
    assert quoted(table["one"][0]) == {"a", "b"}
