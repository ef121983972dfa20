"""What the kernel driver publishes under ``/proc/driver``.

Reading these files costs microseconds, while loading NVML costs milliseconds (seconds
without persistence mode), so requests that only need GPU identities (minor, UUID, bus
id, driver version) are answered from here. The files also hold what NVML does not
tell: the MIG capability access files and their ``nvidia-caps`` minors.
"""

import os
import re
from collections.abc import Iterable, Iterator, Mapping

from nvc.errors import ContainerError, DetectionError, InitializationError
from nvc.model.devices import Gpu, MigDevice
from nvc.records import NamedTuple

PROC = "/proc"
# Where a /proc tree is read: a str, or a Path (tests point the readers at a tree of their own). Paths are
# joined with os.path: pathlib and what it imports (urllib.parse, ipaddress) would cost a start without a
# server more than all the /proc reads.
StrPath = str | os.PathLike[str]

_VERSION = re.compile(r"^NVRM version:.*?\s(\d+(?:\.\d+)+)(?:\s|$)")
_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.0$")


def normalize_bus_id(text: str) -> str | None:
    """``%08X:%02X:%02X.0`` form of a PCI id as NVML prints it, or None if ``text`` is not one.

    The driver writes 4-digit domains under /proc and NVML 8-digit ones; comparing the
    normalised form avoids the mismatch users have hit.
    """
    m = _BUS_ID.match(text.strip())
    if m is None:
        return None
    domain, bus, device = (int(g, 16) for g in m.groups())
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


class ProcGpu(NamedTuple):
    """A GPU as /proc/driver/nvidia/gpus describes it: identity only, no NVML facts."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, which no caller uses; position in bus id order, which is NVML's default (PCI) enumeration order
    minor: int
    model: str
    uuid: str
    bus_id: str  # normalised like Gpu.bus_id
    mig_devices: tuple[MigDevice, ...] = ()  # never known here: MIG needs NVML


def subdirs(path: StrPath, prefix: str = "") -> Iterator[str]:
    """Names of the subdirectories of ``path`` starting with ``prefix``: none where it is missing, or
    where it goes while listed (the driver unloading under a running start: what is read next says so)."""
    try:
        with os.scandir(path) as entries:
            yield from (e.name for e in entries if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return


def _read_text(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except FileNotFoundError:
        raise InitializationError(f"{path}: not found: the NVIDIA kernel driver is not loaded") from None
    except OSError as err:
        raise DetectionError(f"{path}: {err.strerror}") from None


def read_version(proc: StrPath = PROC) -> str:
    """The kernel driver (RM) version, e.g. ``580.95.05``."""
    path = os.path.join(proc, "driver/nvidia/version")
    m = _VERSION.match(_read_text(path))
    if m is None:
        raise DetectionError(f"{path}: no NVRM version line")
    return m.group(1)


def parse_information(text: str, path: str) -> dict[str, str]:
    """``Key: value`` lines of a GPU's information file."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    for key in ("Model", "GPU UUID", "Bus Location", "Device Minor"):
        if key not in fields:
            raise DetectionError(f"{path}: no {key!r} line")
    return fields


def read_gpus(proc: StrPath = PROC) -> tuple[ProcGpu, ...]:
    """GPUs the driver manages, in bus id order (assumed to be NVML's index order).

    GPUs marked ``GPU Excluded: Yes`` are left out, as NVML leaves them out.
    """
    driver_dir = os.path.join(proc, "driver/nvidia")
    gpus_dir = os.path.join(driver_dir, "gpus")
    if not os.path.isdir(driver_dir):
        raise InitializationError(f"{driver_dir}: not found: the NVIDIA kernel driver is not loaded")
    found = []
    for name in sorted(subdirs(gpus_dir)):
        path = os.path.join(gpus_dir, name, "information")
        fields = parse_information(_read_text(path), path)
        if fields.get("GPU Excluded", "No").lower() == "yes":
            continue
        bus_id = normalize_bus_id(fields["Bus Location"])
        if bus_id is None or not fields["Device Minor"].isdigit():
            raise DetectionError(f"{path}: malformed 'Bus Location' or 'Device Minor'")
        found.append((bus_id, int(fields["Device Minor"]), fields["Model"], fields["GPU UUID"]))
    found.sort()
    return tuple(
        ProcGpu(index=i, minor=minor, model=model, uuid=uuid, bus_id=bus_id)
        for i, (bus_id, minor, model, uuid) in enumerate(found)
    )


MIG_MINORS_KEPT = "/run/nvc-py/mig-minors"  # root's own copy of the text (nvc.system.runcache)
MAX_MIG_MINORS = 1 << 20
_kept_minors: tuple[str, str] | None = None  # this process's: (identity, text)


def _mig_minors_text(proc: StrPath) -> tuple[str, str]:
    """The mig-minors file's path and text ("" when missing: drivers without MIG support).

    The driver writes the file anew at each read: 109 KB for 32 GPUs, 6 ms on an H100, at every
    container start (``load-kmods``). Its text is fixed while the driver is loaded, so it is kept, in
    this process and in root's own file for the next, under the driver's version line and the /proc
    entry's identity (a module loaded again is a new entry)."""
    global _kept_minors
    path = os.path.join(proc, "driver/nvidia-caps/mig-minors")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path, ""
    except OSError as err:
        raise DetectionError(f"{path}: {err.strerror}") from None
    try:
        with open(os.path.join(proc, "driver/nvidia/version")) as file:
            version = file.read().partition("\n")[0]
    except OSError:
        return path, _read_minors(path)  # no driver version to keep it under
    identity = f"{st.st_dev} {st.st_ino} {st.st_mtime_ns} {st.st_size} {version}"
    if _kept_minors is not None and _kept_minors[0] == identity:
        return path, _kept_minors[1]
    from nvc.system import runcache

    kept = runcache.load(MIG_MINORS_KEPT, MAX_MIG_MINORS)
    head, _, text = (kept or b"").decode(errors="replace").partition("\n")
    if head != identity:
        text = _read_minors(path)
        runcache.store(MIG_MINORS_KEPT, f"{identity}\n{text}".encode())
    _kept_minors = identity, text
    return path, text


def _read_minors(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError as err:
        raise DetectionError(f"{path}: {err.strerror}") from None


def _minor(path: str, number: int, line: str) -> tuple[str, int]:
    fields = line.split()
    if len(fields) != 2 or not (fields[1].isascii() and fields[1].isdigit()):
        raise DetectionError(f"{path}: line {number}: malformed: {line!r}")
    return fields[0], int(fields[1])


def read_mig_minors(proc: StrPath = PROC) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors``: capability name (``gpu0/gi1/access``) → minor.

    Empty when the file is missing (drivers without MIG support).
    """
    path, text = _mig_minors_text(proc)
    return dict(_minor(path, number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip())


def lookup_mig_minors(names: Iterable[str], proc: StrPath = PROC) -> dict[str, int]:
    """The minors of just ``names`` in mig-minors (names it lacks are left out).

    A driver's file lists every capability of 32 GPUs, thousands of lines: parsing it whole at
    every container start costs far more than a search per name.
    """
    path, text = _mig_minors_text(proc)
    text = "\n" + text
    found = {}
    for name in names:
        start = text.find(f"\n{name} ")
        if start < 0:
            continue
        end = text.find("\n", start + 1)
        line = text[start + 1 : end if end >= 0 else len(text)]
        found[name] = _minor(path, text.count("\n", 0, start) + 1, line)[1]
    return found


def caps_dir(proc: StrPath = PROC) -> str:
    """``/proc/driver/nvidia/capabilities``: the MIG capability tree."""
    return os.path.join(proc, "driver/nvidia/capabilities")


def any_mig_instances(proc: StrPath = PROC) -> bool:
    """Whether some GPU has GPU instances: the driver adds ``gpu<N>/mig/gi<G>`` dirs as they are created.

    (Inferred from the driver's behaviour, not documented by NVIDIA.) It lets ``all``
    skip NVML on machines without MIG devices.
    """
    caps = caps_dir(proc)
    return any(next(subdirs(os.path.join(caps, gpu, "mig"), "gi"), None) for gpu in subdirs(caps, "gpu"))


def mig_minor_names(gpu: Gpu, mig: MigDevice) -> tuple[str, str]:
    """The mig-minors names of a MIG device's GPU-instance and compute-instance access capabilities."""
    gi = f"gpu{gpu.minor}/gi{mig.gpu_instance_id}"
    return f"{gi}/access", f"{gi}/ci{mig.compute_instance_id}/access"


def with_mig_caps(gpu: Gpu, minors: Mapping[str, int], proc: StrPath = PROC) -> Gpu:
    """``gpu`` with each MIG device's access files (those that exist) and their minors filled in
    (``minors``: at least those of :func:`mig_minor_names` for each of its MIG devices)."""
    migs = []
    for mig in gpu.mig_devices:
        gi = f"gpu{gpu.minor}/mig/gi{mig.gpu_instance_id}"
        ci = f"{gi}/ci{mig.compute_instance_id}"
        gi_path = os.path.join(caps_dir(proc), gi, "access")
        ci_path = os.path.join(caps_dir(proc), ci, "access")
        gi_name, ci_name = mig_minor_names(gpu, mig)
        migs.append(
            mig._replace(
                gi_caps_path=gi_path if os.path.isfile(gi_path) else None,
                ci_caps_path=ci_path if os.path.isfile(ci_path) else None,
                gi_caps_minor=minors.get(gi_name),
                ci_caps_minor=minors.get(ci_name),
            )
        )
    return gpu._replace(mig_devices=tuple(migs))


def read_driver_files(proc: StrPath = PROC) -> dict[str, str]:
    """The driver's ``params``, ``version`` and ``registry`` under /proc/driver/nvidia (those present)."""
    files = {}
    for name in ("params", "version", "registry"):
        path = os.path.join(proc, "driver/nvidia", name)
        try:
            with open(path) as file:
                files[name] = file.read()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise ContainerError(f"{path}: {err.strerror}") from None
    return files


def gpu_dirs(proc: StrPath = PROC) -> dict[str, str]:
    """Normalised bus id -> the GPU's /proc/driver/nvidia/gpus directory (host path)."""
    gpus = os.path.join(proc, "driver/nvidia/gpus")
    found = {}
    for name in sorted(subdirs(gpus)):
        bus_id = normalize_bus_id(name)
        if bus_id is not None:
            found[bus_id] = os.path.join(gpus, name)
    return found
