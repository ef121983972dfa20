"""The C tree is in clang-format's style: `make lint-c-format` (part of `make lint-c`) passes over every C file of
native/ and of the test doubles (.clang-format; tests/.clang-format for the fake driver and the test programs), so a
change out of style fails CI here, with the lines clang-format would change."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FORMATTED = (REPO / "native", REPO / "tests" / "fakedriver", REPO / "tests" / "share_programs")
GENERATED = {"unsafe_env.h", "version.h"}  # native/Makefile writes them (the unsafe list, the version)


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True, timeout=300)


def test_the_c_tree_is_clang_format_clean() -> None:
    done = make("lint-c-format")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]


def test_the_check_reads_every_c_file() -> None:
    """The files the Makefile hands clang-format are every hand-written C file of those folders."""
    command = make("-n", "lint-c-format").stdout
    files = {path for folder in FORMATTED for path in folder.rglob("*.[ch]") if path.name not in GENERATED}
    assert len(files) > 60
    assert sorted(str(path.relative_to(REPO)) for path in files if str(path.relative_to(REPO)) not in command) == []


def test_the_check_sees_a_file_out_of_style(tmp_path: Path) -> None:
    """clang-format with the tree's style fails on a file written otherwise, and passes it once formatted."""
    shutil.copy(REPO / ".clang-format", tmp_path / ".clang-format")
    source = tmp_path / "off.c"
    source.write_text("int f(int x){\n  if(x) return 1;\n  return 0;}\n")
    check = ["clang-format", "--dry-run", "--Werror", str(source)]
    assert subprocess.run(check, capture_output=True).returncode != 0
    subprocess.run(["clang-format", "-i", str(source)], check=True)
    assert source.read_text() == "int f(int x)\n{\n    if (x)\n        return 1;\n    return 0;\n}\n"
    assert subprocess.run(check, capture_output=True).returncode == 0
