"""The engines' configuration files (daemon.json, containers.conf and its drop-ins, containerd's
config.toml, crio.conf and its drop-ins) read as input nvc-py does not control.

``nvc-py setup`` and its ``--remove`` (and the package's removal) run as root on files an
administrator, a package or a tool wrote, and write some of them back. So every one is read the
same way: never through a symbolic link (one is refused, the line naming where it leads: writing
through it would change another file, docs/engines.md), as a regular file only (opened O_PATH
first: a FIFO or a device is never opened), at most :data:`MAX_SIZE` bytes, UTF-8, and parsed with
its nesting bounded (json recurses once a level, and a document parsed deep makes every later walk
of it recurse as deep). Writes are :func:`nvc.hook.setup.files.write_files`'s: atomic, the previous
file kept beside it as ``FILE`` + :data:`BACKUP_SUFFIX`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from nvc.errors import InputError
from nvc.records import NamedTuple
from nvc.system.untrusted import PATH_MAX, UnexpectedFile, read_checked

MAX_SIZE = 1 << 20  # bytes of one configuration file: a real one is a few KiB
MAX_DEPTH = 64  # levels of nesting of a parsed document: a real one has fewer than 10
BACKUP_SUFFIX = ".nvc-py.bak"  # the previous file, beside the one setup changed

T = TypeVar("T")


class Text(NamedTuple):
    """A configuration file's text and the mode a rewrite keeps."""

    text: str
    mode: int


def read(path: str, link_hint: Callable[[str], str]) -> Text | None:
    """The configuration file at ``path`` (None: no file). A symbolic link is refused in one line
    naming where it leads and ``link_hint(that path)``: what the user can do instead."""
    try:
        path_fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    try:
        st = os.fstat(path_fd)
        if stat.S_ISLNK(st.st_mode):
            real = os.path.realpath(path)
            raise InputError(f"{path}: is a symbolic link to {real}, not followed ({link_hint(real)})")
        raw = read_checked(path_fd, max_size=MAX_SIZE)
    except UnexpectedFile as err:
        raise InputError(f"{path}: {err}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    finally:
        os.close(path_fd)
    try:
        return Text(raw.decode("utf-8"), stat.S_IMODE(st.st_mode))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None


def parse_bounded(parse: Callable[[str], T], text: str, path: str) -> T:
    """``parse(text)``, refused in one line where the document nests deeper than :data:`MAX_DEPTH`
    (or so deep that the parser ran out of stack)."""
    try:
        doc = parse(text)
    except RecursionError:
        doc = None
    if doc is None or _too_deep(doc):
        raise InputError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    return doc


def _too_deep(doc: Any) -> bool:
    """Whether ``doc``'s objects and arrays nest deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, level = stack.pop()
        children = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else None
        if children is None:
            continue
        if level > MAX_DEPTH:
            return True
        stack.extend((child, level + 1) for child in children)
    return False


def toml(path: str, link_hint: Callable[[str], str]) -> Any:
    """The TOML document (tomlkit's, comments kept) of the file at ``path``, read by :func:`read`
    (None: no file)."""
    import tomlkit

    read_text = read(path, link_hint)
    if read_text is None:
        return None

    def parse(text: str) -> Any:
        try:
            return tomlkit.parse(text)
        except tomlkit.exceptions.TOMLKitError as err:
            raise InputError(f"{path}: not valid TOML ({err})") from None

    return parse_bounded(parse, read_text.text, path)


def check_path(value: str, where: str) -> None:
    """A path a configuration file names (a hooks directory) that the kernel could take: shorter
    than :data:`PATH_MAX` bytes; ``where`` names the file and key."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size >= PATH_MAX:
        raise InputError(f"{where}: a path of {size} bytes, over {PATH_MAX - 1}")


def replace_link(real: str) -> str:
    """The advice on a linked file of a chain the engine reads (no option names it)."""
    return f"put {real} in the link's place"


def config_option(real: str) -> str:
    """The advice on a linked file named by ``--config``."""
    return f"--config {real} changes that file"
