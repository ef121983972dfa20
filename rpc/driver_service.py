"""The driver helper (``nvc:[driver]``): NVML, loaded from the driver root, in a confined child.

The reference talks to NVML through a helper process too: libnvidia-ml comes from the
(possibly untrusted) driver root and first calls into the kernel driver can hang for
seconds, so it runs chrooted into that root, unprivileged, behind a 10 s timeout.

One ``snapshot`` call returns everything discovery needs (versions, GPUs, MIG devices) in a
single round trip, instead of the reference's one procedure per NVML call. pynvml is
imported only in the child: nvc-py's own start-up never pays for it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from nvc.errors import DriverError, InitializationError, NvcError
from nvc.rpc import native_snapshot
from nvc.rpc.driver_wire import setup_params, snapshot_from_wire
from nvc.rpc.helper import DEFAULT_TIMEOUT, HelperClient, die_with_parent
from nvc.rpc.pool import WarmHelper

TYPE_CHECKING = False
if TYPE_CHECKING:  # imported where used: what this module loads delays the helper's fork (``info``)
    from typing import Any

    from nvc.discover.inventory import Inventory
    from nvc.discover.procfs import StrPath
    from nvc.model.devices import DriverSnapshot
    from nvc.rpc.helper import Dispatch

NVML_SONAME = "libnvidia-ml.so.1"
# Host libraries NVML needs, loaded before the chroot so a driver root that lacks them (or
# ships other builds of them) still works: the reference preloads the same set.
_HOST_PRELOADS = ("libm.so.6", "librt.so.1", "libpthread.so.0", "libdl.so.2")
# ---- child side: runs in the confined helper ----------------------------------------------


def bus_id(domain: int, bus: int, device: int) -> str:
    """The normalised PCI bus id, upper-case hex as NVML prints it: "00000000:3B:00.0"."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


class _EarlyInit:
    """``nvmlInit_v2`` and every GPU's first handle (:meth:`_Nvml.attach`) called in a thread of their
    own as soon as the helper is confined, while pynvml imports (ctypes lets go of the GIL for each
    call), so that NVML's start overlaps the import. pynvml's own init, after, finds NVML started and
    only counts one more user (NVML's inits are counted), and its handles are NVML's kept ones.
    Its outcome is not reported: where it failed, pynvml's calls fail the same way and say why."""

    def __init__(self) -> None:
        import threading

        self.thread = threading.Thread(target=self._init, name="nvml-init", daemon=True)
        self.thread.start()

    def _init(self) -> None:
        import ctypes

        try:
            library = ctypes.CDLL(NVML_SONAME)
            if library.nvmlInit_v2() != 0:  # NVML_SUCCESS
                return
            count, handle = ctypes.c_uint(), ctypes.c_void_p()
            if library.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
                for index in range(count.value):
                    library.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
        except (OSError, AttributeError):
            pass

    def wait(self) -> None:
        self.thread.join()


class _Nvml:
    """NVML calls of one snapshot, with NVML errors turned into nvc-py errors."""

    def __init__(self, pynvml: ModuleType, early: _EarlyInit | None = None) -> None:
        self.nvml = pynvml
        self.early = early

    def error_text(self, err: Exception) -> str:
        """NVML's own string for an error (the loaded library's, not pynvml's copy), lower case
        as the reference prints it: "nvml error: driver/library version mismatch"."""
        try:
            text = self.nvml.nvmlErrorString(err.value)  # type: ignore[attr-defined]
        except self.nvml.NVMLError:
            text = str(err)
        return f"nvml error: {text.lower()}"

    def load(self) -> None:
        """dlopen libnvidia-ml through the (chrooted) ld cache and initialise it."""
        import ctypes

        try:
            if self.early is not None:
                self.early.wait()
            ctypes.CDLL(NVML_SONAME)  # pynvml hides dlerror(); this keeps the reason
        except OSError as err:
            reason = str(err).removeprefix(f"{NVML_SONAME}: ")
            raise InitializationError(f"load library failed: {NVML_SONAME}: {reason}") from None
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as err:
            exc = InitializationError(self.error_text(err))
            exc.code = err.value  # type: ignore[attr-defined]
            raise exc from None

    def attach(self) -> None:
        """Open every GPU's handle now: NVML's first handle of a GPU is most of a snapshot's time.
        Done at setup, it overlaps the CLI's imports, or a server worker's idle time; the snapshot
        still asks NVML for every value. Errors are the snapshot's to report."""
        try:
            for index in range(self.nvml.nvmlDeviceGetCount()):
                self.nvml.nvmlDeviceGetHandleByIndex(index)
        except self.nvml.NVMLError:
            pass

    def failed(self, err: Exception, function: str) -> DriverError:
        """The driver error of a failed call: NVML's text and the function, NVML's value as its code."""
        exc = DriverError(f"{self.error_text(err)} ({function})")
        exc.code = err.value  # type: ignore[attr-defined]
        return exc

    def call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, function)(*args)
        except self.nvml.NVMLError as err:
            raise self.failed(err, function) from None

    def mig_mode(self, handle: Any) -> bool:
        """Current MIG mode; a GPU without MIG support answers NOT_SUPPORTED: disabled."""
        try:
            current, _pending = self.nvml.nvmlDeviceGetMigMode(handle)
        except self.nvml.NVMLError_NotSupported:
            return False
        except self.nvml.NVMLError as err:
            raise self.failed(err, "nvmlDeviceGetMigMode") from None
        return bool(current == self.nvml.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, handle: Any) -> list[dict[str, Any]]:
        """MIG devices by position, up to the GPU's maximum, stopping at the first empty slot."""
        found = []
        for position in range(self.call("nvmlDeviceGetMaxMigDeviceCount", handle)):
            try:
                mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, position)
            except (self.nvml.NVMLError_NotFound, self.nvml.NVMLError_InvalidArgument):
                break
            except self.nvml.NVMLError as err:
                raise self.failed(err, "nvmlDeviceGetMigDeviceHandleByIndex") from None
            found.append(
                {
                    "index": position,
                    "gpu_instance_id": self.call("nvmlDeviceGetGpuInstanceId", mig),
                    "compute_instance_id": self.call("nvmlDeviceGetComputeInstanceId", mig),
                    "uuid": self.call("nvmlDeviceGetUUID", mig),
                    "memory_total": self.call("nvmlDeviceGetMemoryInfo", mig).total,
                    "name": self.call("nvmlDeviceGetName", mig),
                }
            )
        return found

    def gpu(self, index: int) -> dict[str, Any]:
        handle = self.call("nvmlDeviceGetHandleByIndex", index)
        pci = self.call("nvmlDeviceGetPciInfo", handle)
        major, minor = self.call("nvmlDeviceGetCudaComputeCapability", handle)
        mig_enabled = self.mig_mode(handle)
        return {
            "index": index,
            "minor": self.call("nvmlDeviceGetMinorNumber", handle),
            "model": self.call("nvmlDeviceGetName", handle),
            "brand": self.call("nvmlDeviceGetBrand", handle),  # NVML's value: driver_wire names it
            "uuid": self.call("nvmlDeviceGetUUID", handle),
            "bus_id": bus_id(pci.domain, pci.bus, pci.device),
            "architecture": f"{major}.{minor}",
            "memory_total": self.call("nvmlDeviceGetMemoryInfo", handle).total,
            "mig_enabled": mig_enabled,
            "mig_devices": self.mig_devices(handle) if mig_enabled else [],
        }

    def memory(self) -> list[dict[str, Any]]:
        """Each GPU's identity and NVML's memory figures now (bytes): the exporter's one call per read."""
        found = []
        for index in range(self.call("nvmlDeviceGetCount")):
            handle = self.call("nvmlDeviceGetHandleByIndex", index)
            info = self.call("nvmlDeviceGetMemoryInfo", handle)
            found.append(
                {
                    "index": index,
                    "uuid": self.call("nvmlDeviceGetUUID", handle),
                    "model": self.call("nvmlDeviceGetName", handle),
                    "total": info.total,
                    "used": info.used,
                }
            )
        return found

    def snapshot(self) -> dict[str, Any]:
        return {
            "driver_version": self.call("nvmlSystemGetDriverVersion"),
            "cuda_version": self.call("nvmlSystemGetCudaDriverVersion"),
            "gpus": [self.gpu(i) for i in range(self.call("nvmlDeviceGetCount"))],
        }


def _preload_host_libraries() -> None:
    import ctypes

    for soname in _HOST_PRELOADS:
        try:
            ctypes.CDLL(soname)
        except OSError:  # not every libc splits these out (musl): nothing to preload then
            pass


def import_pynvml() -> ModuleType:
    """pynvml, imported without what ``ctypes.util`` imports.

    pynvml imports ``ctypes.util.find_library`` and calls it only on Windows; ``ctypes.util``
    imports subprocess, shutil and tempfile, more than half of importing pynvml, on the helper's way
    to its first answer (docs/performance.md). While pynvml imports, ``ctypes.util`` is a stand-in whose ``find_library`` imports the
    real module when called; the stand-in is gone once pynvml is, so any later import gets the real one.
    """
    import sys

    loaded = sys.modules.get("pynvml")
    if loaded is not None:
        return loaded
    stand_in = None
    if "ctypes.util" not in sys.modules:
        stand_in = ModuleType("ctypes.util", "a stand-in while pynvml imports (nvc.rpc.driver_service)")
        stand_in.find_library = _find_library  # type: ignore[attr-defined]
        sys.modules["ctypes.util"] = stand_in
    try:
        import pynvml
    finally:
        if stand_in is not None and sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
    return pynvml


def _find_library(name: str) -> str | None:
    from ctypes.util import find_library

    return find_library(name)


def _warm_to_confine() -> None:
    """What a preforked driver helper imports while the options it is about to be sent come: what
    confining it and starting NVML need, not pynvml (for the root /, :func:`serve_driver` imports it
    once NVML is starting)."""
    import ctypes  # noqa: F401
    import threading  # noqa: F401

    import nvc.system.confinement  # noqa: F401


def _warm() -> None:
    """What a preforked driver helper does before it knows its driver root: the imports."""
    _warm_to_confine()
    import_pynvml()


def serve_driver(root: str, uid: int, gid: int, events: bool = False) -> Dispatch:
    """Helper setup: confine, then load NVML from the driver root; return the methods (``events``:
    also the Kubernetes device plugin's XID events and topology, nvc.rpc.nvml_events)."""
    from nvc.system.confinement import DRIVER_HELPER, confine

    if events:
        from nvc.rpc import nvml_events
    early = None
    if root == "/" and "pynvml" not in sys.modules:
        # pynvml's files stay where they are in a chroot to /: NVML starts, confined, while it imports
        confine(DRIVER_HELPER, root, (uid, gid), rearm=die_with_parent)
        early = _EarlyInit()
        pynvml = import_pynvml()
    else:
        pynvml = import_pynvml()  # here, before the chroot: the module's file lives on the host
        if root != "/":
            _preload_host_libraries()
        confine(DRIVER_HELPER, root, (uid, gid), rearm=die_with_parent)  # a driver root can at most lie to us
    nvml = _Nvml(pynvml, early)
    nvml.load()
    nvml.attach()
    # No "shutdown" method: the helper's exit ends NVML's use as nvmlShutdown would, sooner.
    methods: Dispatch = {"snapshot": nvml.snapshot, "memory": nvml.memory}
    if not events:
        return methods
    watch = nvml_events.XidWatch(nvml)
    return {**methods, "xid_events": watch.wait, "topology": lambda: nvml_events.topology(nvml)}


# ---- parent side --------------------------------------------------------------------------


class DriverClient:
    """The parent's view of a running driver helper."""

    def __init__(self, helper: HelperClient) -> None:
        self.helper = helper

    @property
    def pid(self) -> int:
        return self.helper.pid

    def snapshot(self) -> DriverSnapshot:
        """Versions, GPUs and MIG devices as NVML reports them (caps paths left to /proc)."""
        return snapshot_from_wire(self.helper.call("snapshot"))

    def memory(self) -> list[dict[str, Any]]:
        """Per GPU: ``index``, ``uuid``, ``model``, ``total`` and ``used`` bytes, as NVML reports them now."""
        return self.helper.call("memory")

    def xid_events(self, timeout_ms: int) -> dict[str, Any]:
        """Critical XIDs within ``timeout_ms``: ``{"watched": [UUID…], "events": [{"uuid", "xid"}…]}``."""
        return self.helper.call("xid_events", timeout_ms=timeout_ms)

    def topology(self) -> dict[str, dict[str, int]]:
        """NVML's common-ancestor level of each pair of GPUs, by UUID ({} where unknown)."""
        return self.helper.call("topology")


# The driver helper forked ahead (see :func:`prefork`, :func:`prestart`) until open_driver takes it.
def _stamp(params: dict[str, Any]) -> object:
    """The driver a helper started with ``params`` loads (its NVML stays loaded: one started before
    an upgrade would serve the old driver's answers)."""
    from nvc.discover import driverstamp

    return driverstamp.take(params["root"])


_ahead = WarmHelper("driver", serve_driver, failure=DriverError, stamp=_stamp)


def prefork(argv: list[str]) -> None:
    """Fork this process's driver helper now, before the command line is even parsed.

    Importing pynvml and loading NVML take longer in the helper than everything the CLI imports
    before it knows its options (``nvc-py info``). Where no global option comes before the command
    (``argv``, the words after the program's name), the helper is sent the configuration's root
    and user at once (it imports what its confinement and NVML's start need while they come), so
    NVML loads while the CLI imports; else it only imports, pynvml too, until :func:`open_driver`
    sends it the real options. Either is a guess that affects speed only:
    open_driver closes a helper started for other options than the call's, and one never taken exits
    with this process.
    """
    guess = bool(argv) and not argv[0].startswith("-")
    _ahead.prefork(_warm_to_confine if guess else _warm)
    if guess:
        from nvc.config.options import resolve_options

        try:
            opts = resolve_options(None, None, None, False)
        except NvcError:  # the CLI says what is wrong, later and in its own words
            return
        _ahead.begin(**setup_params(opts.root, opts.user))


def prestart(root: str = "/", user: tuple[int, int] | None = None) -> WarmHelper:
    """Fork the driver helper and start it for ``root`` and ``user`` now: NVML loads before any
    call needs it. The hook server's idle workers keep one so; :func:`open_driver` takes it
    when asked for the same, and closes it otherwise. One never taken exits with this process.
    Returns the warm helper, whose set-up report the caller may settle (:meth:`WarmHelper.settle`)."""
    _ahead.prepare(**setup_params(root, user))
    native_snapshot.keep_warm(_ahead.holds)  # a snapshot for the same is this helper's, NVML loaded already
    return _ahead


@contextmanager
def open_driver(
    root: str = "/",
    user: tuple[int, int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    wait: bool = True,
    events: bool = False,
) -> Iterator[DriverClient]:
    """Start the driver helper for ``root``; shut it down (and reap it) on exit.

    ``user`` is the helper's uid/gid (see :func:`_setup`). ``wait=False``: do not wait for
    NVML to load here; the first call does (and raises its load error), so the caller can
    import what it needs meanwhile. ``events``: the helper also serves :meth:`DriverClient.xid_events`
    and :meth:`DriverClient.topology` (the Kubernetes device plugin).
    """
    helper = _ahead.take(setup_params(root, user, events), timeout, wait)
    with helper:
        yield DriverClient(helper)


def inventory(
    root: str, user: tuple[int, int] | None, proc: StrPath | None = None, timeout: float = DEFAULT_TIMEOUT
) -> Inventory:
    """Everything NVML reports (through a driver helper for ``root``: the native one where no Python
    helper is kept warm, :mod:`nvc.rpc.native_snapshot`), with each MIG device's /proc access files and
    nvidia-caps minors added (:func:`nvc.discover.inventory.from_snapshot`)."""
    from nvc.discover import inventory as inv

    snap = native_snapshot.snapshot(root, user, timeout)
    if snap is None:
        with open_driver(root=root, user=user, timeout=timeout) as drv:
            snap = drv.snapshot()
    return inv.from_snapshot(snap, *(() if proc is None else (proc,)))
