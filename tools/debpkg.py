"""``make deb``: nvc-py as the Debian package ``dist/nvc-py_VERSION_ARCH.deb``, for the distribution
this runs on (Debian 12, Ubuntu 24.04: build it on, or in a debootstrap root of, the target). As root.

How, and why so:
- Built where it is installed. In a private mount namespace the package's tree is bind-mounted at
  /usr/lib/nvc-py (on an overlay of /usr/lib, so that a host without one gets no directory and a
  host with one, a ``make install``, has it neither seen nor touched): the environment, the
  launchers' ``#!`` lines and their site directories (the Makefile's ``fronts``, as ``make
  install`` makes them) name /usr/lib/nvc-py as installed; nothing is relocated afterwards.
- Exactly the Python distributions deploy/debian/python-lock.txt names, installed without
  resolution, then ``pip check``: two builds of one commit hold the same files. pip and setuptools
  leave the environment once it is made; no test tool is ever in it.
- No bytecode is shipped: postinst compiles it where it is installed and prerm removes it again (as
  Debian's py3compile and py3clean do for the distribution's modules), so dpkg owns exactly the
  package's files. The build compiles it once to prove that postinst can.
- Depends: the interpreter the environment was made from, its minor version pinned (the
  environment's site-packages and extension modules are for it), what dpkg-shlibdeps finds for the
  ELF files, libseccomp2 (pyseccomp opens it with ctypes) and init-system-helpers (the maintainer
  scripts' deb-systemd-helper).
- The tree comes from a copy of the working tree as git sees it (no build leftovers); in a release
  tarball (``git archive``'s output, no .git) every file but what .gitignore names, the commit
  and its time from deploy/debian/source-commit (export-subst). Every file's time is
  SOURCE_DATE_EPOCH (the commit's), modes are normalised, owners root (dpkg-deb
  --root-owner-group).

Subcommands: ``build`` (make deb), ``stage`` (its part inside the namespace), ``files`` (run by the
staged environment: the package's files made by nvc's own code) and ``lock`` (make deb-lock).
"""

from __future__ import annotations

import argparse
import email.parser
import fnmatch
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "nvc-py"
LIBDIR = "/usr/lib/nvc-py"  # as the Makefile's and hook/setup/engines.py's
VENV = f"{LIBDIR}/venv"
SYSTEM_PYTHON = "/usr/bin/python3"  # the distribution's: what Depends names
DEBIAN = Path("deploy/debian")  # in the source tree: maintainer scripts, logrotate, lintian overrides, lock
LOCK = DEBIAN / "python-lock.txt"
SOURCE_COMMIT = DEBIAN / "source-commit"  # git archive writes the commit in (export-subst)
PURGE_MODULE = Path("hook/setup/purge.py")  # postrm's purge: written into it (the module's docstring says why)
PURGE_MARK = "@PURGE_PY@"
MAINTAINER = "nvc-py developers <dev@nvc-py.invalid>"
# Shipped, never enabled: the admin turns them on where a node runs them.
OPTIONAL_UNITS = (Path("deploy/systemd/nvc-py-device-plugin.service"), Path("deploy/systemd/nvc-py-exporter.service"))
# Shipped and enabled by postinst: `nvc-py cdi refresh` after a driver install or reload, and at boot.
REFRESH_UNITS = tuple(Path(f"deploy/systemd/nvc-py-cdi-refresh.{suffix}") for suffix in ("service", "path", "timer"))
STATIC_FILES = {  # source (under DEBIAN) -> path in the package
    "postinst": "DEBIAN/postinst",
    "prerm": "DEBIAN/prerm",
    "postrm": "DEBIAN/postrm",
    "logrotate": "etc/logrotate.d/nvc-py",
    "init.d": "etc/init.d/nvc-py-hook",
    "lintian-overrides": "usr/share/lintian/overrides/nvc-py",
}
DEPENDS = ("libseccomp2", "init-system-helpers (>= 1.54~)")
LOCK_HEADER = """\
# The Python distributions the Debian package bundles (make deb installs exactly these, no resolution:
# two builds of one commit hold the same files). setup.cfg's install_requires and what they require;
# tests/test_deb.py checks that they satisfy it. `make deb-lock` writes it again from the newest releases.
"""
DESCRIPTION = """\
Description: GPU container prestart hook, OCI runtime wrapper and GPU-sharing shim
 nvc-py makes NVIDIA GPUs appear inside containers run by Docker, Podman, CRI-O
 or containerd, in the spirit of NVIDIA's libnvidia-container: its OCI
 prestart hook mounts the driver's libraries, binaries, device nodes and IPC
 sockets into a container that asks for GPUs, grants device cgroup access and
 updates the container's ld cache. It can cap each container's share of a GPU.
 .
 The package registers the hook with Podman and CRI-O and runs its hook server
 by socket activation; Docker and containerd are registered with nvc-py setup
 docker and nvc-py setup containerd.
"""


def run(argv: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; a failure ends the build with its command and output."""
    result = subprocess.run([str(a) for a in argv], text=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise SystemExit(
            f"debpkg: {' '.join(map(str, argv))} failed ({result.returncode}):\n"
            f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )
    return result


# --- the control files: pure ---------------------------------------------------------------------


class Control(NamedTuple):
    """The fields of DEBIAN/control that vary."""

    version: str
    arch: str
    maintainer: str
    installed_size: int  # KiB
    depends: tuple[str, ...]


def control_text(c: Control) -> str:
    return (
        f"Package: {PACKAGE}\nVersion: {c.version}\nArchitecture: {c.arch}\nMaintainer: {c.maintainer}\n"
        f"Installed-Size: {c.installed_size}\nDepends: {', '.join(c.depends)}\nSection: admin\n"
        f"Priority: optional\n{DESCRIPTION}"
    )


def python_depends(minor: tuple[int, int]) -> tuple[str, str]:
    """The interpreter the environment was made from, to its minor version."""
    major, low = minor
    return f"python3 (>= {major}.{low})", f"python3 (<< {major}.{low + 1})"


def changelog_text(version: str, maintainer: str, epoch: int, commit: str) -> str:
    """A native package's changelog (/usr/share/doc/nvc-py/changelog.gz): one entry, this build's."""
    date = time.strftime("%a, %d %b %Y %H:%M:%S +0000", time.gmtime(epoch))
    return (
        f"{PACKAGE} ({version}) unstable; urgency=medium\n\n"
        f"  * Built from commit {commit} (the repository's history is the changelog).\n\n"
        f" -- {maintainer}  {date}\n"
    )


class Bundled(NamedTuple):
    """A Python distribution in the environment, for the copyright file."""

    name: str
    version: str
    license: str


def copyright_text(bundled: Iterable[Bundled], site_packages: str) -> str:
    lines = "".join(f" {b.name} {b.version}: {b.license}\n" for b in sorted(bundled, key=lambda b: b.name.lower()))
    return (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        f"Upstream-Name: {PACKAGE}\n"
        "Comment: The Python distributions bundled in /usr/lib/nvc-py/venv, with the licenses\n"
        " their metadata declare (their own license files are in their dist-info directories in\n"
        f" {site_packages}):\n"
        f"{lines}\n"
        "Files: *\n"
        "Copyright: nvc-py developers\n"
        "License: Apache-2.0\n"
        " On Debian systems, the full text of the Apache License 2.0 is in\n"
        " /usr/share/common-licenses/Apache-2.0.\n"
    )


def with_purge(script: str, module: str) -> str:
    """postrm with ``module`` in place of its line PURGE_MARK, each line a comment starting "#|"
    (postrm runs them with python3; as comments, no shell check reads them as shell)."""
    lines = script.split("\n")
    at = lines.index(PURGE_MARK)
    return "\n".join([*lines[:at], *(f"#|{line}" for line in module.rstrip("\n").split("\n")), *lines[at + 1 :]])


def bundled_license(metadata_text: str) -> Bundled:
    """Name, version and license of a METADATA file: License-Expression, else License (its first
    line), else the license classifiers."""
    msg = email.parser.Parser().parsestr(metadata_text, headersonly=True)
    declared = msg.get("License-Expression") or (msg.get("License") or "").strip().split("\n")[0].strip()
    if not declared or declared.upper() == "UNKNOWN":
        declared = ", ".join(c.split(" :: ")[-1] for c in msg.get_all("Classifier") or [] if c.startswith("License ::"))
    return Bundled(msg["Name"], msg["Version"], declared or "see its dist-info")


def commented(config_text: str) -> str:
    """The conffile /etc/nvc-py/config.yaml: every default setting, commented out (a file of
    comments means all defaults, as no file does; the admin uncomments what changes)."""
    body = [line for line in config_text.splitlines() if not line.startswith("#")]
    return (
        "# nvc-py's configuration (its source's docs/configuration.md). Every setting is shown at its default,\n"
        "# commented out: uncomment and change what differs here. `nvc-py config show` prints the\n"
        "# effective configuration; the hooks read this file at every container start.\n"
        + "".join(f"# {line}\n" for line in body)
    )


def installed_size(root: Path) -> int:
    """Installed-Size in KiB, as dpkg-gencontrol counts: each file's size rounded up, 1 per other entry."""
    total = 0
    for path in _entries(root):
        st = path.lstat()
        total += -(-st.st_size // 1024) if path.is_file() and not path.is_symlink() else 1
    return total


def _entries(root: Path) -> list[Path]:
    """Every path under ``root`` but DEBIAN/, sorted."""
    return sorted(p for p in root.rglob("*") if p.relative_to(root).parts[0] != "DEBIAN")


def mode_for(path: Path, mode: int) -> int:
    """Normalised permissions: directories and programs 0755, shared objects, the modules and data
    of the bundled distributions (some wheels mark them executable) and other files 0644."""
    if path.is_dir():
        return 0o755
    program = mode & 0o111 and "site-packages" not in path.parts and not path.name.endswith(".so")
    return 0o755 if program else 0o644


def extension_module(relative: str) -> str:
    """The module name of an extension module's path in site-packages (``yaml/_yaml.cpython-311-x86_64-linux-gnu.so``
    is ``yaml._yaml``)."""
    return relative.split(".", 1)[0].replace("/", ".")


def _is_elf(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


# --- build ---------------------------------------------------------------------------------------


def ignored(relative: str, is_dir: bool, patterns: Sequence[str]) -> bool:
    """Whether .gitignore's ``patterns`` name ``relative`` itself (the walk prunes what they name
    above it), in the forms that file uses: a glob with a slash but a trailing one is anchored at
    the top, one without is matched against the name, a trailing slash names directories alone."""
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        glob = pattern.rstrip("/")
        name = relative if "/" in glob else relative.rsplit("/", 1)[-1]
        if fnmatch.fnmatchcase(name, glob.lstrip("/")):
            return True
    return False


def gitignore_patterns(text: str) -> list[str]:
    """The patterns of a .gitignore; a form :func:`ignored` does not read is refused."""
    patterns = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for pattern in patterns:
        if pattern.startswith("!") or "**" in pattern or "\\" in pattern:
            raise SystemExit(f"debpkg: .gitignore: {pattern!r}: a form a build without git does not read")
    return patterns


def source_files(source: Path) -> list[str]:
    """The working tree as git sees it (tracked and untracked files, not ignored ones), relative
    paths; in a tree without git's metadata (a release tarball, git archive's output) every file but
    what .gitignore names, as distribution builders build."""
    if (source / ".git").exists():
        names = run(["git", "-C", source, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
        return sorted(set(filter(None, names.split("\0"))))
    ignore = source / ".gitignore"
    patterns = gitignore_patterns(ignore.read_text()) if ignore.is_file() else []
    found = []
    for top, dirs, names in os.walk(source):
        base = os.path.relpath(top, source)
        prefix = "" if base == "." else f"{base}/"
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]  # listed, never walked into
        dirs[:] = [d for d in dirs if d not in links and not ignored(prefix + d, True, patterns)]
        found += [prefix + n for n in (*names, *links) if not ignored(prefix + n, False, patterns)]
    return sorted(found)


def copy_tree(source: Path, dest: Path) -> None:
    """:func:`source_files` copied, symlinks as symlinks."""
    for name in source_files(source):
        src, dst = source / name, dest / name
        if not src.is_symlink() and not src.is_file():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)


def source_commit(source: Path) -> tuple[str, int]:
    """The commit the tree is (12 hex digits) and its time: from git in a clone, from SOURCE_COMMIT
    in git archive's output (export-subst, .gitattributes); SOURCE_DATE_EPOCH, when set, for the time."""
    if (source / ".git").exists():
        commit, epoch = run(["git", "-C", source, "log", "-1", "--format=%H %ct"]).stdout.split()
    else:
        text = (source / SOURCE_COMMIT).read_text().strip()
        if text.startswith("$Format:"):
            raise SystemExit(
                f"debpkg: {source}: neither a git clone nor git archive's output of a commit "
                f"({SOURCE_COMMIT} names no commit)"
            )
        commit, epoch = text.split()
    given = os.environ.get("SOURCE_DATE_EPOCH", "")
    return commit[:12], int(given) if given.isdigit() else int(epoch)


def build(version: str, out: Path, maintainer: str, pip_cache: Path, xz_level: int | None = None) -> Path:
    """The whole build; returns the .deb's path. ``pip_cache``: pip's cache for these builds alone (a
    wheel pip built elsewhere, for another interpreter of the same tag, would come with its paths).
    ``xz_level``: the data's compression level (None: dpkg-deb's own, 6)."""
    out = out.resolve()
    source, root, scratch = out / "src", out / "root", out / "ns"
    for path in (source, root, scratch):
        shutil.rmtree(path, ignore_errors=True)
    copy_tree(REPO, source)
    (root / LIBDIR.lstrip("/")).mkdir(parents=True)
    scratch.mkdir()
    run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            SYSTEM_PYTHON,
            source / "tools/debpkg.py",
            "stage",
            "--source",
            source,
            "--root",
            root,
            "--scratch",
            scratch,
            "--pip-cache",
            pip_cache.resolve(),
        ]
    )
    commit, epoch = source_commit(REPO)
    finish(root, source, version, maintainer, epoch, commit)
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    deb = out / f"{PACKAGE}_{version}_{arch}.deb"
    # xz: what every dpkg and lintian reads (Ubuntu's dpkg-deb would choose zstd, which Debian 12's cannot)
    run(
        [
            "dpkg-deb",
            "--root-owner-group",
            "-Zxz",
            *([] if xz_level is None else [f"-z{xz_level}"]),
            "--build",
            root,
            deb,
        ],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
    )
    return deb


def stage(source: Path, root: Path, scratch: Path, pip_cache: Path) -> None:
    """In the private mount namespace: the environment, native programs, launchers and the files nvc's
    code makes, at /usr/lib/nvc-py (which is ``root``'s)."""
    run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", scratch])
    for name in ("upper", "work"):
        (scratch / name).mkdir()
    run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir=/usr/lib,upperdir={scratch}/upper,workdir={scratch}/work",
            "/usr/lib",
        ]
    )
    os.makedirs(LIBDIR, exist_ok=True)
    run(["mount", "--bind", root / LIBDIR.lstrip("/"), LIBDIR])
    python = f"{VENV}/bin/python"
    run([SYSTEM_PYTHON, "-m", "venv", VENV])
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input", "--cache-dir", pip_cache]
    install = [*pip, "install", "-q", "--no-compile", "--no-deps", "--no-binary", "python-prctl", "--use-pep517"]
    run([*install, "-r", source / LOCK])
    run([*install, source])
    run([*pip, "check"])
    run([*pip, "uninstall", "-q", "-y", "pip", "setuptools"])
    run(["make", "-C", source / "native"])
    shutil.copy2(source / "native/libnvc-share.so", f"{LIBDIR}/libnvc-share.so")
    shutil.copy2(source / "native/nvc-py-hook-client", f"{LIBDIR}/nvc-py-hook-client")
    shutil.copy2(source / "native/nvc-py-driver-snapshot", f"{LIBDIR}/nvc-py-driver-snapshot")
    run(["make", "-C", source, "--no-print-directory", "fronts", f"BINDIR={root}/usr/bin", f"PYTHON={SYSTEM_PYTHON}"])
    run([python, "-I", source / "tools/debpkg.py", "files", "--source", source, "--root", root])
    elves = [p for p in sorted(Path(LIBDIR).rglob("*")) if _is_elf(p)]
    for elf in elves:  # as dh_strip: what a program needs to run, no debugging symbols
        run(["strip", "--remove-section=.comment", "--remove-section=.note", "--strip-unneeded", elf])
    site = next(Path(VENV).glob("lib/python3*/site-packages"))
    modules = [extension_module(str(p.relative_to(site))) for p in elves if site in p.parents]
    run([python, "-I", "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)", *modules])
    run([python, "-I", "-m", "compileall", "-q", f"{VENV}/lib"])  # what postinst does must succeed


def unit_dir() -> str:
    """Where the distribution's packages put systemd units: /lib/systemd/system (Debian 12), or
    /usr/lib/systemd/system where dpkg diverts /lib to protect the merged /usr's aliases (Ubuntu
    24.04; a package's /lib would be registered as the diversion, and a purge would take that)."""
    moved = run(["dpkg-divert", "--truename", "/lib"]).stdout.strip() != "/lib"
    return "usr/lib/systemd/system" if moved else "lib/systemd/system"


def files(source: Path, root: Path) -> None:
    """Run by the staged environment's interpreter (nvc importable): the hooks.d files, units,
    bash completion and configuration file, each from the code that makes or reads them."""
    from nvc import config
    from nvc.hook.setup import engines, hooksdirs

    texts = engines.hook_files(str(root / hooksdirs.DEFAULT_HOOKS_DIR.lstrip("/")))
    units = root / unit_dir()
    texts[str(units / engines.SOCKET_UNIT)] = engines.socket_unit()
    texts[str(units / engines.SERVER_UNIT)] = engines.server_unit()
    for unit in (*OPTIONAL_UNITS, *REFRESH_UNITS):
        texts[str(units / unit.name)] = (source / unit).read_text()
    texts[str(root / "usr/share/bash-completion/completions" / PACKAGE)] = run(
        [f"{LIBDIR}/nvc-py-python"], env={"PATH": "/usr/bin:/bin", "_NVC_PY_COMPLETE": "bash_source"}
    ).stdout
    texts[str(root / config.DEFAULT_PATH.lstrip("/"))] = commented(config.show(config.defaults()))
    for path, text in texts.items():
        if path.endswith((".json", engines.SERVER_UNIT)) and LIBDIR not in text:  # setup's fallback: pip's scripts
            raise SystemExit(f"debpkg: {path} does not name {LIBDIR}'s programs:\n{text}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


def finish(root: Path, source: Path, version: str, maintainer: str, epoch: int, commit: str) -> None:
    """Outside the namespace: the environment tidied, links made relative, the static and generated
    files, modes and times, then DEBIAN/."""
    libdir = root / LIBDIR.lstrip("/")
    venv = libdir / "venv"
    for cache in sorted(root.rglob("__pycache__")):
        shutil.rmtree(cache)
    for entry in (venv / "bin").iterdir():  # activate scripts, console scripts (the fronts replace them)
        if not entry.name.startswith("python"):
            entry.unlink()
    if not any(p.is_file() for p in (venv / "include").rglob("*")):  # made empty by venv
        shutil.rmtree(venv / "include")
    site = next(venv.glob("lib/python3*/site-packages"))
    for direct in site.glob("*.dist-info/direct_url.json"):  # the build's source path
        direct.unlink()
    for link in [p for p in root.rglob("*") if p.is_symlink() and os.path.isabs(os.readlink(p))]:
        target = os.readlink(link)  # all within /usr: relative, as Debian's policy wants
        link.unlink()
        link.symlink_to(os.path.relpath(target, "/" + str(link.parent.relative_to(root))))
    for name, dest in STATIC_FILES.items():
        (root / dest).parent.mkdir(parents=True, exist_ok=True)
        text = (source / DEBIAN / name).read_text()
        (root / dest).write_text(with_purge(text, (source / PURGE_MODULE).read_text()) if name == "postrm" else text)
        if dest.startswith("etc/init.d/"):
            (root / dest).chmod(0o755)
    doc = root / "usr/share/doc" / PACKAGE
    doc.mkdir(parents=True)
    site_in_package = "/" + str(site.relative_to(root))
    bundled = [bundled_license(m.read_text(errors="replace")) for m in sorted(site.glob("*.dist-info/METADATA"))]
    if len(bundled) != len(list(site.glob("*-info"))):
        raise SystemExit(f"debpkg: {site}: a distribution without a dist-info METADATA (for the copyright file)")
    (doc / "copyright").write_text(copyright_text(bundled, site_in_package))
    with (
        open(doc / "changelog.gz", "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        gz.write(changelog_text(version, maintainer, epoch, commit).encode())
    entries = _entries(root)
    for path in [*entries, *sorted((root / "DEBIAN").iterdir())]:
        if not path.is_symlink():
            path.chmod(mode_for(path, path.stat().st_mode) if path.parent.name != "DEBIAN" else 0o755)
    conffiles = sorted(
        "/" + str(p.relative_to(root)) for p in entries if p.relative_to(root).parts[0] == "etc" and p.is_file()
    )
    (root / "DEBIAN/conffiles").write_text("".join(f"{c}\n" for c in conffiles))
    (root / "DEBIAN/md5sums").write_text(
        "".join(
            f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"
            for p in entries
            if p.is_file() and not p.is_symlink() and "/" + str(p.relative_to(root)) not in conffiles
        )
    )
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    depends = (*python_depends(sys.version_info[:2]), *shlib_depends(root, entries), *DEPENDS)
    (root / "DEBIAN/control").write_text(
        control_text(Control(version, arch, maintainer, installed_size(root), depends))
    )
    for name in ("control", "conffiles", "md5sums"):
        (root / "DEBIAN" / name).chmod(0o644)
    for path in [*entries, *(root / "DEBIAN").iterdir(), root / "DEBIAN", root]:
        os.utime(path, (epoch, epoch), follow_symlinks=False)


def shlib_depends(root: Path, entries: Iterable[Path]) -> tuple[str, ...]:
    """What dpkg-shlibdeps says the ELF files need (it wants a debian/control: a minimal one, elsewhere)."""
    elves = [p for p in entries if _is_elf(p)]
    with tempfile.TemporaryDirectory(prefix="nvc-shlibdeps-") as tmp:
        (Path(tmp) / "debian").mkdir()
        (Path(tmp) / "debian/control").write_text(f"Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: any\n")
        out = run(["dpkg-shlibdeps", "-O", *(f"-e{p}" for p in elves)], cwd=tmp).stdout
    line = next((line for line in out.splitlines() if line.startswith("shlibs:Depends=")), "shlibs:Depends=")
    return tuple(d.strip() for d in line.split("=", 1)[1].split(",") if d.strip())


def lock(path: Path) -> None:
    """deploy/debian/python-lock.txt from the newest releases satisfying install_requires."""
    sys.path.insert(0, str(REPO / "tools"))
    import missing_deps

    with tempfile.TemporaryDirectory(prefix="nvc-lock-") as tmp:
        run([SYSTEM_PYTHON, "-m", "venv", tmp])
        pip = [f"{tmp}/bin/python", "-m", "pip", "--disable-pip-version-check"]
        run([*pip, "install", "-q", "--no-compile", *missing_deps.runtime_requirements()])
        frozen = run([*pip, "freeze", "--exclude", "pip", "--exclude", "setuptools"]).stdout
    path.write_text(LOCK_HEADER + "".join(sorted(frozen.splitlines(keepends=True), key=str.lower)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build")
    b.add_argument("--version", required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--maintainer", default=MAINTAINER)
    b.add_argument("--pip-cache", type=Path, required=True)
    b.add_argument("--xz-level", type=int, choices=range(10), help="xz's level (default: dpkg-deb's)")
    s = commands.add_parser("stage")
    for name in ("--source", "--root", "--scratch", "--pip-cache"):
        s.add_argument(name, type=Path, required=True)
    f = commands.add_parser("files")
    for name in ("--source", "--root"):
        f.add_argument(name, type=Path, required=True)
    commands.add_parser("lock")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build(args.version, args.out, args.maintainer, args.pip_cache, args.xz_level))
    elif args.command == "stage":
        stage(args.source, args.root, args.scratch, args.pip_cache)
    elif args.command == "files":
        files(args.source, args.root)
    else:
        lock(REPO / LOCK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
