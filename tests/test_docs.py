"""The documentation against the code it describes: every configuration key in docs/configuration.md
(from the configuration's own defaults, so a new key fails here until it is documented), the README's
shape and its links, CI running the README's test command, and CHANGELOG.md's version being the
package's."""

from __future__ import annotations

import re
from pathlib import Path

from nvc import __version__, config

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_LINES = 200
MAX_LINE = 160


def _dotted(values: dict, prefix: str = "") -> dict[str, object]:
    """The settings of ``config show``'s document by key, a section's as ``section.key``."""
    found: dict[str, object] = {}
    for key, value in values.items():
        found.update(_dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return found


def _yaml_flow(value: object) -> str:
    """A default as the table shows it: YAML's flow style."""
    if isinstance(value, list):
        return f"[{', '.join(map(_yaml_flow, value))}]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def test_every_configuration_key_is_documented_with_its_default() -> None:
    settings = _dotted(config.Config()._replace(ldconfig="@/sbin/ldconfig").as_dict())  # the host may have .real
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([a-z0-9.-]+)` \| ([^|]+) \|", (REPO / "docs/configuration.md").read_text(), re.M)
    }
    assert len(settings) > 30 and settings.keys() == _dotted(config.defaults().as_dict()).keys()
    assert [key for key in settings if key not in rows] == []  # a key `config show` prints, undocumented
    assert [key for key in rows if key not in settings] == []  # documented, but no such key
    assert [key for key, value in settings.items() if not rows[key].startswith(f"`{_yaml_flow(value)}`")] == []


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES
    assert [n for n, line in enumerate(lines, 1) if len(line) > MAX_LINE] == []


def test_the_readme_links_every_page_that_exists() -> None:
    text = README.read_text()
    named = set(re.findall(r"\b((?:docs|native)/[A-Za-z-]+\.md|CHANGELOG\.md)\b", text))
    assert [name for name in sorted(named) if not (REPO / name).is_file()] == []
    assert [p.name for p in sorted((REPO / "docs").glob("*.md")) if f"docs/{p.name}" not in named] == []


def test_ci_runs_the_readmes_test_command() -> None:
    ci = [line for line in (REPO / ".ci/run").read_text().splitlines() if line.startswith("make")]
    development = README.read_text().split("## Development", 1)[1]
    assert ci == ["make test"] and "\nmake test " in development and "\nmake demo " in development


def test_the_changelogs_newest_version_is_the_packages() -> None:
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert versions and versions[0] == __version__
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)


def _layout_paths() -> set[str]:
    """The paths docs/development.md's Layout table names in its first column."""
    section = (REPO / "docs/development.md").read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return {
        name
        for line in section.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([^`]+)`", line.split("|")[1])
    }


def _tracked_folders() -> set[str]:
    """The checkout's top-level folders, its Python package folders and native/'s source folders, as the
    table writes them."""
    tops = {
        f"{path.name}/"
        for path in REPO.iterdir()
        if path.is_dir()
        and (REPO / ".git").exists()
        and path.name
        not in {
            ".git",
            ".venv",
            ".make",
            "build",
            "dist",
            ".pytest_cache",
            ".mypy_cache",
            ".ruff_cache",
            ".whl",
            ".debs",
        }
        and not path.name.endswith(".egg-info")
    }
    packages = {
        f"{path.parent.relative_to(REPO)}/"
        for top in ("nvc", "rpc", "hook")
        for path in (REPO / top).rglob("*/__init__.py")
    }
    sources = {path.parent for path in (REPO / "native").rglob("*.[ch]")}  # not a build's folder (native/sanitize/)
    native = {
        f"{folder.relative_to(REPO)}/"
        for path in sources
        for folder in (path, *path.parents)
        if REPO / "native" in folder.parents
    }
    return tops | packages | native


def test_the_development_layout_table_is_the_tree() -> None:
    """Every top-level folder, every package folder of nvc/, rpc/ and hook/ and every folder of native/
    has its row, and every row names what exists: a folder moved or added fails here until the table
    follows."""
    named = _layout_paths()
    assert sorted(_tracked_folders() - named) == []
    assert sorted(name for name in named if "*" not in name and not (REPO / name).exists()) == []
