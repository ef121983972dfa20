"""One exception hierarchy for nvc-py.

Each error kind prints as ``nvc-py: <kind> error: <message>`` (the reference CLI's
wording, which users grep for) and exits with a stable code, so scripts and runtimes
can tell failures apart without parsing text.

Messages quote what a container image, a spec or a file said, so they are untrusted text: a
message prints as one line (control characters, terminal escapes and newlines escaped, the
whole cut at :data:`MESSAGE_LIMIT`), and a quoted value goes through :func:`shown`.
"""

from __future__ import annotations

SHOWN_LIMIT = 200  # characters of one quoted value
MESSAGE_LIMIT = 1000  # characters of one whole message
# Where no NVIDIA driver is loaded: what a newcomer can still run (Makefile's try, demo/try.py).
TRY_WITHOUT_GPU = (
    "to try nvc-py without a GPU, run `make try` in a copy of nvc-py's source (its fake driver "
    "is in the source, not installed)"
)


def _cut(text: str, limit: int) -> tuple[str, str]:
    """(the first ``limit`` characters, a marker naming how many were left off, or "")."""
    if len(text) <= limit:
        return text, ""
    return text[:limit], f"... (+{len(text) - limit} more characters)"


def cut(value: str, limit: int = SHOWN_LIMIT) -> str:
    """``value``'s first ``limit`` characters, with a marker when it was longer (unquoted, for
    messages whose wording has the value bare; the whole message is escaped when printed)."""
    head, marker = _cut(value, limit)
    return head + marker


def shown(value: str, limit: int = SHOWN_LIMIT) -> str:
    """``repr`` of ``value``'s first ``limit`` characters, with a marker when it was longer.

    repr escapes newlines, escape sequences and every other unprintable character, so an
    image's value can neither forge a second line nor drive the user's terminal.
    """
    head, marker = _cut(value, limit)
    return repr(head) + marker


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` with its unprintable characters escaped as repr escapes them, cut at ``limit``."""
    head, marker = _cut(text, limit)
    if not head.isprintable():
        head = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    return head + marker


class NvcError(Exception):
    """Base of every error nvc-py reports to its user."""

    kind = "internal"
    exit_code = 1

    def __str__(self) -> str:
        return f"{self.kind} error: {one_line(super().__str__())}"


class InputError(NvcError):
    """A flag, argument, file or variable given by the user is malformed."""

    kind = "input"
    exit_code = 2


class InitializationError(NvcError):
    """The driver could not be loaded or initialised."""

    kind = "initialization"
    exit_code = 3


class DriverError(NvcError):
    """The driver answered with an error, or its helper died or timed out."""

    kind = "driver"
    exit_code = 4


class DetectionError(NvcError):
    """Driver files (ld cache, libraries, binaries) could not be detected."""

    kind = "detection"
    exit_code = 5


class DeviceError(NvcError):
    """A requested device does not exist or cannot be used."""

    kind = "device"
    exit_code = 6


class RequirementError(NvcError):
    """A container requirement (cuda>=…, brand=…) is not satisfied."""

    kind = "requirement"
    exit_code = 7


class ContainerError(NvcError):
    """The container (pid, rootfs, namespaces, cgroup) cannot be inspected or entered."""

    kind = "container"
    exit_code = 8


class MountError(NvcError):
    """A mount inside the container failed or was refused as unsafe."""

    kind = "mount"
    exit_code = 9


class LdcacheError(NvcError):
    """Updating the container's ld cache failed."""

    kind = "ldcache"
    exit_code = 10


class PrivilegeError(NvcError):
    """nvc-py lacks a privilege it needs (not root, capability missing)."""

    kind = "permission"
    exit_code = 11


class OutputError(NvcError):
    """What the command prints could not be written (its stdout closed, full or a broken pipe): the
    caller did not get the result, so the command failed, whatever it did."""

    kind = "output"
    exit_code = 12


def proc_failure(pid: int, path: str, err: OSError, kind: type[NvcError] = ContainerError) -> NvcError:
    """The error of opening ``path``, a file of /proc/``pid``: a container whose process is gone
    (ENOENT, ESRCH: it exited before or while nvc-py configured it) is one ContainerError naming
    the pid, whichever step saw it; anything else is ``kind``'s "open failed" line."""
    import errno

    if err.errno in (errno.ENOENT, errno.ESRCH):
        return ContainerError(f"container process {pid} is gone")
    return kind(f"open failed: {path}: {err.strerror}")


def from_kind(kind: str, message: str, code: int | None = None) -> NvcError:
    """The error a helper reported by its class's ``kind`` (:mod:`nvc.rpc.protocol`), as that class, with
    the service's ``code`` (an NVML return value); an unknown kind is a plain :class:`NvcError`."""
    classes = {cls.kind: cls for cls in (NvcError, *NvcError.__subclasses__())}
    exc = classes.get(kind, NvcError)(message)
    exc.code = code  # type: ignore[attr-defined]
    return exc
