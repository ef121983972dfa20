"""The test suite's own layout: no Python file under tests/ imports a test module. What tests share
(fixtures, constants, helpers) lives in tests/harness/, so that a test file can be split, moved or
run alone without another test file's module, and its module-scoped fixtures, coming with it.

Read from the source files (every import, also those inside functions), as the layer test reads
the package's. And the tree's: no Python program without ``.py`` (a reader, or a tool, takes a
file by its name for what it is: bench/share.py, never bench/share).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The tree's folders holding programs (not the ignored ones a build or `make dev` makes).
PROGRAM_FOLDERS = ("bench", "demo", "tools", "tests", "deploy", ".ci", "nvc", "rpc", "hook", "native")


def module_names(tests: Path) -> set[str]:
    """The names the test modules under ``tests`` are imported by (pytest puts tests/ on sys.path)."""
    return {path.stem for path in tests.glob("test_*.py")}


def imported_test_modules(path: Path, modules: set[str]) -> list[str]:
    """Each import in ``path`` (at any depth) of one of ``modules``, as "LINE: MODULE"."""
    found = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in modules or (parts[0] == "tests" and parts[1:2] and parts[1] in modules):
                found.append(f"{node.lineno}: {name}")
    return found


def layout_errors(tests: Path) -> dict[str, list[str]]:
    """Every Python file under ``tests`` that imports a test module: {file: its imports of them}."""
    modules = module_names(tests)
    errors = {}
    for path in sorted(tests.rglob("*.py")):
        found = imported_test_modules(path, modules)
        if found:
            errors[str(path.relative_to(tests))] = found
    return errors


def test_no_file_imports_a_test_module() -> None:
    errors = layout_errors(TESTS)
    assert not errors, "test modules imported (move what they share to tests/harness/):\n" + "\n".join(
        f"  {path}: {', '.join(found)}" for path, found in errors.items()
    )


def test_an_import_of_a_test_module_is_found_at_any_depth(tmp_path: Path) -> None:
    """The check itself: top-level and lazy imports, plain and from-imports, are each found once; a
    harness module, or a name that merely begins with test_, is not a test module."""
    (tmp_path / "test_a.py").write_text(
        "from harness.fixtures import runc\nimport test_b as b\ndef test_x():\n    from test_b import FIXTURE\n"
    )
    (tmp_path / "test_b.py").write_text(
        "import test_helpers_missing\n\nclass C:\n    def m(self):\n        import os, test_a\n"
    )
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "shared.py").write_text("import tests.test_b\n")
    assert layout_errors(tmp_path) == {
        "harness/shared.py": ["1: tests.test_b"],
        "test_a.py": ["2: test_b", "4: test_b"],
        "test_b.py": ["5: test_a"],
    }


def python_without_suffix(root: Path, folders: tuple[str, ...] = PROGRAM_FOLDERS) -> list[str]:
    """The files under ``folders`` of ``root`` with no suffix whose first line runs Python."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and not path.suffix and "__pycache__" not in path.parts:
                with path.open("rb") as f:
                    first = f.readline(200)
                if first.startswith(b"#!") and b"python" in first:
                    found.append(str(path.relative_to(root)))
    return found


def test_every_python_program_is_named_py() -> None:
    assert python_without_suffix(TESTS.parent) == []


def test_the_suffix_check_reads_the_first_line(tmp_path: Path) -> None:
    """The checker itself: a Python shebang without .py counts; a shell script, a .py file do not."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "run").write_text("#!/usr/bin/env python3\n")
    (tmp_path / "bench" / "env").write_text("#!/bin/sh\n")
    (tmp_path / "bench" / "ok.py").write_text("#!/usr/bin/env python3\n")
    assert python_without_suffix(tmp_path, ("bench",)) == ["bench/run"]
