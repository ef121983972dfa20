"""The launchers' code cache (nvc/system/codecache.py): modules come from it only where their source
is the one it compiled and the search would find them there; anything else imports as usual.

Each case runs a fresh interpreter as the launchers do (``-I -S``, site's directories put back), over
a small package written to the test's directory, or over the installed launchers and their cache.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bundle import reachable_from_userns
from harness.hookserver import LIBDIR

LAUNCHER = LIBDIR / "nvc-py-hook-python"
CACHE = LIBDIR / "code-cache"
NOBODY = int(Path("/proc/sys/kernel/overflowuid").read_text())


def _launcher_path() -> list[str]:
    """The directories the installed launcher puts back on sys.path (its third line)."""
    line = LAUNCHER.read_text().splitlines()[2]
    assert line.startswith("sys.path.extend(")
    return ast.literal_eval(line[len("sys.path.extend(") : -1])


def _python(code: str, *extra: Path, wrapper: tuple[str, ...] = ()) -> dict:
    """Run ``code`` as a launcher would (its path, then ``extra``; under ``wrapper``'s command), and
    return what it printed (JSON)."""
    search = [*_launcher_path(), *map(str, extra)]
    run = subprocess.run(
        [*wrapper, sys.executable, "-I", "-S", "-c", f"import sys; sys.path.extend({search!r})\n{code}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


_BUILD = "from nvc.system import codecache; import json; print(json.dumps(codecache.build({cache!r}, ['demo.user'])))"
_USE = """
from nvc.system import codecache; import json
used = codecache.use({cache!r})
import demo.user
print(json.dumps({{"used": used, "value": demo.user.VALUE, "loaders": {{
    name: type(sys.modules[name].__loader__).__name__ for name in ("demo", "demo.user", "demo.base")}}}}))
"""


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A package of two modules, one importing the other, and a cache of them."""
    package = tmp_path / "lib/demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("VALUE = 'cached'\n")
    (package / "user.py").write_text("from demo.base import VALUE\n")
    assert _python(_BUILD.format(cache=str(tmp_path / "cache")), tmp_path / "lib") >= 3
    return tmp_path


def _use(demo: Path, cache: Path | None = None, wrapper: tuple[str, ...] = ()) -> dict:
    return _python(_USE.format(cache=str(cache or demo / "cache")), demo / "lib", wrapper=wrapper)


def test_modules_come_from_the_cache_where_their_sources_are_unchanged(demo: Path) -> None:
    assert _use(demo) == {
        "used": True,
        "value": "cached",
        "loaders": {"demo": "_CachedLoader", "demo.user": "_CachedLoader", "demo.base": "_CachedLoader"},
    }


def test_a_changed_source_is_imported_as_usual(demo: Path) -> None:
    base = demo / "lib/demo/base.py"
    st = base.stat()
    base.write_text("VALUE = 'edited'\n")  # the same size: only the mtime tells, by a nanosecond
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    shutil.rmtree(base.parent / "__pycache__")  # whose .pyc records whole seconds: Python would take it
    found = _use(demo)
    assert found["value"] == "edited"
    assert found["loaders"] == {"demo": "_CachedLoader", "demo.user": "_CachedLoader", "demo.base": "SourceFileLoader"}


def test_a_module_found_elsewhere_first_is_not_taken_from_the_cache(demo: Path) -> None:
    """A parent package whose search path changed: its submodule is looked up there."""
    shadow = demo / "shadow"
    shadow.mkdir()
    (shadow / "base.py").write_text("VALUE = 'shadow'\n")
    code = _USE.format(cache=str(demo / "cache")).replace(
        "import demo.user", f"import demo; demo.__path__.insert(0, {str(shadow)!r}); import demo.user"
    )
    found = _python(code, demo / "lib")
    assert (found["value"], found["loaders"]["demo.base"]) == ("shadow", "SourceFileLoader")


def test_a_damaged_entry_is_compiled_from_its_source(demo: Path) -> None:
    """Bytes of one module's code damaged on disk: that module comes from its source, the rest from
    the cache."""
    cache = demo / "cache"
    data = bytearray(cache.read_bytes())
    length = int.from_bytes(data[:8], "little")
    data[8 + length :] = b"\xff" * (len(data) - 8 - length)  # every code object unreadable
    cache.write_bytes(bytes(data))
    found = _use(demo)
    assert (found["used"], found["value"]) == (True, "cached")


@pytest.mark.parametrize(
    "spoil",
    ["group-writable", "not root's", "nobody's", "a symlink", "another sys.path", "another Python", "truncated"],
)
def test_a_cache_that_is_not_trusted_or_does_not_fit_is_ignored(demo: Path, spoil: str) -> None:
    cache = demo / "cache"
    if spoil == "group-writable":
        cache.chmod(0o664)
    elif spoil == "not root's":
        os.chown(cache, 1000, 1000)
    elif spoil == "nobody's":  # the overflow uid, which the initial user namespace maps: a real owner
        os.chown(cache, NOBODY, NOBODY)
    elif spoil == "a symlink":
        (demo / "link").symlink_to(cache)
        cache = demo / "link"
    elif spoil == "another sys.path":
        _python(_BUILD.format(cache=str(cache)), demo / "lib", demo)
    elif spoil == "another Python":
        data = bytearray(cache.read_bytes())
        at = data.index(sys.hexversion.to_bytes(4, "little"))
        data[at : at + 4] = (sys.hexversion - 1).to_bytes(4, "little")
        cache.write_bytes(bytes(data))
    else:
        cache.write_bytes(cache.read_bytes()[:100])
    found = _use(demo, cache)
    assert found["used"] is False
    assert set(found["loaders"].values()) == {"SourceFileLoader"}
    assert found["value"] == "cached"


# An ordinary user in a user namespace of its own, mapped to root there (a rootless engine's hook):
# the host's root is not mapped, so root's files show the kernel's overflow uid.
ROOTLESS = ("runuser", "-u", "nobody", "--", "unshare", "--map-root-user")


@pytest.mark.parametrize("directory", ["root's", "writable by all"])
def test_a_rootless_user_namespace_takes_roots_cache_from_roots_directory(demo: Path, directory: str) -> None:
    """Root's cache, as a rootless engine's hook sees it (an owner its namespace does not map, as the
    sources beside it), is used; not where the directory holding it lets anyone replace it."""
    reachable_from_userns(demo)
    if directory == "writable by all":
        demo.chmod(0o777)
    shown = _python("import json, os; print(json.dumps(os.stat('/').st_uid))", wrapper=ROOTLESS)
    assert shown == NOBODY  # root's, as the namespace shows it
    found = _use(demo, wrapper=ROOTLESS)
    assert found["value"] == "cached"
    if directory == "root's":
        assert found["used"] is True
        assert set(found["loaders"].values()) == {"_CachedLoader"}
    else:
        assert found["used"] is False
        assert set(found["loaders"].values()) == {"SourceFileLoader"}


def test_the_launchers_map_the_installed_cache() -> None:
    """make install wrote the cache, and each launcher maps it before its program's imports."""
    assert CACHE.stat().st_uid == 0 and not CACHE.stat().st_mode & 0o022
    for name in ("nvc-py-python", "nvc-py-hook-python", "nvc-py-runtime-python"):
        lines = (LIBDIR / name).read_text().splitlines()
        assert lines[3:5] == ["from nvc.system.codecache import use", f"use({str(CACHE)!r})"], lines
