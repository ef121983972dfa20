"""Register nvc-py with Docker: the runtime ``nvc-py`` in dockerd's daemon.json, and the command
``docker run --gpus`` runs.

dockerd (19.03 and later) turns ``--gpus`` into a prestart hook at the ``nvidia-container-runtime-hook``
it found on its PATH when it started (arguments ``nvidia-container-runtime-hook prestart``, dockerd's
own environment) and puts NVIDIA_VISIBLE_DEVICES (``all``, the first N indexes or the listed ids) and,
where capabilities were named, NVIDIA_DRIVER_CAPABILITIES in the spec: what nvc-py-hook reads. So a
link of that name to nvc-py-hook's front makes ``--gpus`` run nvc-py; the front goes by the file it
runs from (/proc/self/exe), never by the name it was called under. It is made only where no such file
is, or the one there is nvc-py's link: a file of NVIDIA's toolkit is never replaced.

daemon.json is edited as text, never re-serialised: a member is added as the first of its object, laid
out as the member after it, and removed the same way, so the user's layout stays as it was and removing
what setup added gives the file back byte for byte; a file setup created (its own keys only, laid out
as setup writes them) is removed. The plan is made (and bad input refused) before anything is written.
daemon.json is read as every engine's configuration (nvc.hook.setup.engineconf: a symbolic link is refused,
never written through) and a rewrite keeps the previous file as ``daemon.json.nvc-py.bak``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from nvc.errors import InputError, cut, shown
from nvc.hook.setup import engineconf
from nvc.hook.setup.engines import SYSTEMD_RUNNING, script_path
from nvc.hook.setup.files import remove_files, remove_files_and_dirs, staging_name, write_files
from nvc.records import NamedTuple
from nvc.system.programs import FIXED_PATH, HOOK_SCRIPT, LIBDIR, RUNTIME_SCRIPT, installed_program

GPUS_HOOK = "nvidia-container-runtime-hook"  # the command dockerd's --gpus runs, looked up on its PATH
DAEMON_JSON = "/etc/docker/daemon.json"  # dockerd's default --config-file (setup docker's --config)
GPUS_HOOK_DIR = "/usr/bin"  # where setup docker links GPUS_HOOK by default (--gpus-hook-dir)
RUNTIME_NAME = "nvc-py"  # setup docker's --runtime-name
RUNTIMES = "runtimes"
DEFAULT_RUNTIME = "default-runtime"
RESTART = ["restart", "docker"]
_WHITESPACE = " \t\n\r"  # JSON's


class Member(NamedTuple):
    """One member of an object in daemon.json's text: where its key and its value are."""

    key: str
    start: int  # the key's opening quote
    value: int  # the value's first character
    end: int  # one past the value


class Span(NamedTuple):
    """An object in daemon.json's text: its opening brace and its members, in order."""

    open: int
    members: tuple[Member, ...]

    def member(self, key: str) -> Member | None:
        return next((m for m in self.members if m.key == key), None)


class Link(NamedTuple):
    """The ``nvidia-container-runtime-hook`` link: where nvc-py's points now and where it should
    (None: no link of nvc-py's)."""

    path: str
    before: str | None
    after: str | None


class Plan(NamedTuple):
    """What ``setup docker`` (or its ``--remove``) changes: daemon.json's text before and after
    (None: no file), its mode, the link, and lines to tell the user."""

    config: str
    before: str | None
    after: str | None
    mode: int
    link: Link
    notes: tuple[str, ...]
    removing: bool = False  # --remove: daemon.json restored, so setup's backup of it goes too

    @property
    def changes(self) -> bool:
        return self.before != self.after or self.link.before != self.link.after


# --- daemon.json as text (pure) -------------------------------------------------------------------


class _Refused(ValueError):
    """What makes a file JSON that setup will not edit (a duplicate key, a non-JSON constant)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, refusing a key given twice (dockerd would read the last, the text edit the
    first)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Refused(f"duplicate key {shown(key)}")
        seen.add(key)
    return dict(pairs)


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def parse(text: str, path: str) -> dict[str, Any]:
    """daemon.json's document, checked to be one setup can edit: a JSON object (no duplicate keys,
    nested at most engineconf.MAX_DEPTH deep), ``runtimes`` an object of objects, ``default-runtime``
    a string."""

    def load(text: str) -> Any:
        try:
            return json.loads(text, object_pairs_hook=_unique, parse_constant=_constant)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
        except _Refused as err:
            raise InputError(f"{path}: {err}") from None

    doc = engineconf.parse_bounded(load, text, path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a JSON object")
    runtimes = doc.get(RUNTIMES, {})
    if not isinstance(runtimes, dict) or not all(isinstance(r, dict) for r in runtimes.values()):
        raise InputError(f"{path}: {RUNTIMES} is not an object of objects")
    if not isinstance(doc.get(DEFAULT_RUNTIME, ""), str):
        raise InputError(f"{path}: {DEFAULT_RUNTIME} is not a string")
    return doc


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _object(text: str, i: int) -> Span:
    """The object whose ``{`` is at ``i`` in ``text`` (valid JSON: :func:`parse` checked it)."""
    decoder = json.JSONDecoder()
    members = []
    j = _skip(text, i + 1)
    while text[j] != "}":
        key, after_key = json.decoder.scanstring(text, j + 1)
        value = _skip(text, _skip(text, after_key) + 1)  # past the colon
        _, end = decoder.raw_decode(text, value)
        members.append(Member(key, j, value, end))
        j = _skip(text, end)
        if text[j] == ",":
            j = _skip(text, j + 1)
    return Span(i, tuple(members))


def _top(text: str) -> Span:
    return _object(text, _skip(text, 0))


def _inner(text: str, key: str) -> Span:
    """The object that is the top object's member ``key``."""
    member = _top(text).member(key)
    assert member is not None
    return _object(text, member.value)


def _insert(text: str, obj: Span, key: str, value: Any) -> str:
    """``key: value`` as ``obj``'s first member, after the same whitespace as the member now first."""
    member = f"{json.dumps(key)}: {json.dumps(value)}"
    after = obj.open + 1
    if not obj.members:
        return text[:after] + member + text[after:]
    return text[:after] + text[after : obj.members[0].start] + member + "," + text[after:]


def _delete(text: str, obj: Span, key: str) -> str:
    """``text`` without ``obj``'s member ``key``: the inverse of :func:`_insert` (a first member goes
    with what stands before it and its comma; a later one with the comma before it)."""
    k = next(i for i, m in enumerate(obj.members) if m.key == key)
    member = obj.members[k]
    if k > 0:
        return text[: obj.members[k - 1].end] + text[member.end :]
    if len(obj.members) == 1:
        return text[: obj.open + 1] + text[member.end :]
    comma = _skip(text, member.end)
    return text[: obj.open + 1] + text[comma + 1 :]


def _replace(text: str, member: Member, value: Any) -> str:
    return text[: member.value] + json.dumps(value) + text[member.end :]


def created(doc: dict[str, Any]) -> str:
    """The text of a daemon.json setup creates."""
    return json.dumps(doc, indent=2) + "\n"


def with_runtime(text: str | None, path: str, name: str, entry: dict[str, Any], set_default: bool) -> str:
    """daemon.json's ``text`` (None: no file) with runtime ``name`` registered as ``entry`` (an entry
    of that name replaced) and, with ``set_default``, made dockerd's default-runtime."""
    if text is None:
        return created({RUNTIMES: {name: entry}, **({DEFAULT_RUNTIME: name} if set_default else {})})
    doc = parse(text, path)
    runtimes = doc.get(RUNTIMES)
    if runtimes is None:
        text = _insert(text, _top(text), RUNTIMES, {name: entry})
    elif name not in runtimes:
        text = _insert(text, _inner(text, RUNTIMES), name, entry)
    elif runtimes[name] != entry:
        member = _inner(text, RUNTIMES).member(name)
        assert member is not None
        text = _replace(text, member, entry)
    if set_default and doc.get(DEFAULT_RUNTIME) != name:
        top = _top(text)
        member = top.member(DEFAULT_RUNTIME)
        text = _insert(text, top, DEFAULT_RUNTIME, name) if member is None else _replace(text, member, name)
    return text


def without_runtime(text: str, path: str, name: str) -> str | None:
    """daemon.json's ``text`` without runtime ``name`` (and ``runtimes`` where it was the only one),
    and without ``default-runtime`` where that names it; None where setup created the file."""
    doc = parse(text, path)
    runtimes = doc.get(RUNTIMES, {})
    ours = (
        set(doc) <= {RUNTIMES, DEFAULT_RUNTIME} and list(runtimes) == [name] and doc.get(DEFAULT_RUNTIME, name) == name
    )
    if ours and text == created(doc):
        return None
    if doc.get(DEFAULT_RUNTIME) == name:
        text = _delete(text, _top(text), DEFAULT_RUNTIME)
    if name in runtimes:
        text = (
            _delete(text, _top(text), RUNTIMES) if len(runtimes) == 1 else _delete(text, _inner(text, RUNTIMES), name)
        )
    return text


# --- reading the host -----------------------------------------------------------------------------


def read_config(path: str) -> tuple[str | None, int]:
    """daemon.json's text (None: no file) and the mode it is to keep (:func:`nvc.hook.setup.engineconf.read`:
    never through a link, never blocking, bounded)."""
    read = engineconf.read(path, engineconf.config_option)
    return (None, 0o644) if read is None else read


def _ours(path: str) -> str | None:
    """Where the link at ``path`` points when it is nvc-py's (a symlink to nvc-py-hook), else None."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return target if target in (os.path.join(LIBDIR, HOOK_SCRIPT), script_path(HOOK_SCRIPT)) else None


def _path_notes(link: str) -> list[str]:
    """Where dockerd, with systemd's default PATH, would not run ``link`` for ``--gpus``."""
    directories = FIXED_PATH.split("=", 1)[1].split(":")
    directory = os.path.dirname(link)
    if directory not in directories:
        return [
            f"{directory} is not on dockerd's usual PATH ({':'.join(directories)}): "
            f"docker run --gpus finds {GPUS_HOOK} there only where dockerd's PATH has it"
        ]
    for earlier in directories[: directories.index(directory)]:
        other = os.path.join(earlier, GPUS_HOOK)
        if os.path.lexists(other) and _ours(other) is None:
            return [f"{other} comes first on dockerd's PATH: docker run --gpus runs that one"]
    return []


def plan_link(directory: str, wanted: bool | None) -> tuple[Link, list[str]]:
    """The ``--gpus`` hook link in ``directory``: made where ``wanted`` (None: where no other file is
    there), removed where not wanted and it is nvc-py's. A file that is not nvc-py's is never replaced:
    refused where the link was asked for, left alone (and said) otherwise."""
    path = os.path.join(directory, GPUS_HOOK)
    before = _ours(path)
    if before is None and os.path.lexists(path):
        if wanted:
            raise InputError(f"{path}: exists and is not nvc-py's link (NVIDIA's toolkit?): not replaced")
        return Link(path, None, None), (
            [f"left {path} alone (not nvc-py's): docker run --gpus runs it, docker run --runtime nvc-py runs nvc-py"]
            if wanted is None
            else []
        )
    if wanted is False:
        return Link(path, before, None), []
    if not os.path.isdir(directory):
        raise InputError(f"{cut(directory)}: not a directory (cannot link {GPUS_HOOK} there)")
    return Link(path, before, installed_program(HOOK_SCRIPT)), _path_notes(path)


def plan_install(config: str, name: str, set_default: bool, gpus_hook: bool | None, hook_dir: str) -> Plan:
    """``setup docker``: runtime ``name`` (nvc-py-runtime) in daemon.json, and the ``--gpus`` link."""
    before, mode = read_config(config)
    doc = parse(before, config) if before is not None else {}
    notes = []
    if set_default and doc.get(DEFAULT_RUNTIME, name) != name:
        notes.append(
            f"{config}: {DEFAULT_RUNTIME} was {shown(doc[DEFAULT_RUNTIME])} "
            f"(--remove takes the key out: dockerd's default, runc)"
        )
    after = with_runtime(before, config, name, {"path": installed_program(RUNTIME_SCRIPT)}, set_default)
    link, link_notes = plan_link(hook_dir, gpus_hook)
    return Plan(config, before, after, mode, link, (*notes, *link_notes))


def plan_remove(config: str, name: str, hook_dir: str) -> Plan:
    """``setup docker --remove``: runtime ``name`` out of daemon.json, and the link where it is nvc-py's."""
    before, mode = read_config(config)
    after = without_runtime(before, config, name) if before is not None else None
    link, _ = plan_link(hook_dir, False)
    return Plan(config, before, after, mode, link, (), removing=True)


# --- changing the host ----------------------------------------------------------------------------


def _symlink(path: str, target: str) -> None:
    """``path`` a symlink to ``target``, replacing nvc-py's own link there in one rename."""
    tmp = staging_name(path)
    try:
        os.symlink(target, tmp)
        os.replace(tmp, path)
    except OSError as err:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise InputError(f"{path}: cannot link: {err.strerror}") from None


def apply(plan: Plan) -> list[str]:
    """Make the changes of ``plan``; returns what was done, a line each."""
    done = []
    backup = [plan.config + engineconf.BACKUP_SUFFIX] if plan.removing else []
    if plan.after is None:
        # the backup first: the directory setup made for daemon.json (/etc/docker where Docker is not
        # installed) goes too, once empty
        done += remove_files(backup) + (remove_files_and_dirs([plan.config]) if plan.before is not None else [])
    else:
        if plan.after != plan.before:
            write_files({plan.config: plan.after}, plan.mode, backup=(plan.config,))
            done.append(f"wrote {plan.config}")
        else:
            done.append(f"unchanged {plan.config}")
        done += remove_files(backup)  # after the write, which keeps the file it replaced as the backup
    link = plan.link
    if link.after is None:
        done += remove_files([link.path]) if link.before is not None else []
    elif link.after != link.before:
        _symlink(link.path, link.after)
        done.append(f"linked {link.path} -> {link.after}")
    else:
        done.append(f"unchanged {link.path}")
    return done + list(plan.notes)


def preview(plan: Plan) -> list[str]:
    """What :func:`apply` would do (``--dry-run``)."""
    lines = []
    if plan.after != plan.before:
        lines.append(f"# {plan.config}\n{plan.after}" if plan.after is not None else f"would remove {plan.config}")
    link = plan.link
    if link.after != link.before:
        lines.append(f"would link {link.path} -> {link.after}" if link.after else f"would remove {link.path}")
    return lines + list(plan.notes)


def restart_lines(plan: Plan) -> list[str]:
    """What the user must do for dockerd to see ``plan``'s changes (it reads both at its start)."""
    if not plan.changes:
        return []
    how = (
        "systemctl restart docker, or --restart"
        if os.path.isdir(SYSTEMD_RUNNING)
        else "--restart reloads a running dockerd's runtimes (SIGHUP); --gpus needs it started again"
    )
    return [
        f"dockerd reads daemon.json, and looks for nvidia-container-runtime-hook, when it starts: restart it ({how})"
    ]
