"""GPU sharing's MPS backend, planned: which device a container shares through CUDA MPS, the control
daemon nvc-py runs for that device, and the per-client limits the container's processes get.

A shared container's device whose backend is ``mps`` (the container's ``NVC_SHARE_BACKEND``, else the
configuration's ``sharing.backend``) is served by one ``nvidia-cuda-mps-control -d`` per device, with
``CUDA_VISIBLE_DEVICES=<UUID>`` and its pipe and log directories in ``MPS_DIR/<UUID>/``
(:mod:`nvc.apply.mps` starts it, restarts it when it died, stops it after its last container). The
container sees the pipe directory at CUDA's default, ``/tmp/nvidia-mps``, and gets its share as MPS's
own per-client limits (:func:`limits_lines`), which the shim puts in each process's environment
before the driver reads them: the compute cap as the active thread percentage, the memory limit as the
pinned device memory limit (with room for the context), the latency class as the client priority. The
shim's time slices and weights are off for that container (MPS shares the SMs) but for a weight below
the heaviest among the device's clients, which becomes a duty cycle (:func:`duty_cycle`), recomputed for
every running client as containers come and go (:func:`rebalanced`); its memory accounting stays.

A process reaches one MPS daemon (one pipe directory), so MPS serves a container one device: a
container with several devices, any of them ``mps``, is refused. So is one whose driver lacks the
MPS binaries: a container that asked for MPS's limits does not silently run without them.

Pure: the host's side is :mod:`nvc.apply.mps`.
"""

import math
import posixpath
from collections.abc import Iterable, Mapping

from nvc.errors import ContainerError
from nvc.plan import share
from nvc.records import NamedTuple

# The daemons' directories: not under /run/nvc-py, which is root's alone (0700), because the MPS
# server the control daemon starts for a non-root client runs as that user and must reach its pipe
# directory.
MPS_DIR = "/run/nvc-py-mps"
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"  # CUDA's default CUDA_MPS_PIPE_DIRECTORY
CONTROL, SERVER = "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"
THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
CLIENT_PRIORITY = "CUDA_MPS_CLIENT_PRIORITY"
PIPE = "CUDA_MPS_PIPE_DIRECTORY"
# What the shim may set in a process's environment (native/shim/base/config.c's mps_names)
CLIENT_VARIABLES = (THREADS, PINNED, CLIENT_PRIORITY, PIPE)
# MPS's client priority of each latency class (nvc.containerenv.sharing.PRIORITY_CLASSES): 0 normal, 1 below
PRIORITY_OF_CLASS = {"latency-critical": 0, "batch": 1}
_MIB = 1 << 20
# MPS counts a client's own context against its pinned memory limit (a 4 GiB limit let an H200 client,
# driver 580, allocate 3.25-3.5 GiB); the shim counts allocations only. The pinned limit is the memory
# limit and this much more, so that a process meets the shim's limit, exact on every allocation path
# and what it is told its memory is, and MPS's stays a backstop one context above it.
CONTEXT_RESERVE_MIB = 1024
# The 50/50 overlap (the pair's throughput, % of one alone) a duty cycle is planned for: training pairs
# under MPS measured 110-190 % on the H100, and where the lighter runs a part f of the time the split is
# 1:r at f = 100 / (100 + (r - 1) x overlap / 2) (docs/performance.md)
PLANNED_OVERLAP = 150


class MpsClient(NamedTuple):
    """A container sharing ``device`` through its MPS daemon: what the host does for it
    (:mod:`nvc.apply.mps`) and the share its processes get (:func:`limits_lines`)."""

    container_id: str
    device: str  # the GPU's or MIG device's UUID: the daemon's CUDA_VISIBLE_DEVICES
    control: str  # host path of the driver's nvidia-cuda-mps-control
    uid: int  # the container's process user, as its user namespace numbers it
    compute: int | None = None  # cap, percent
    weight: int | None = None
    memory: int | None = None  # bytes
    priority: int | None = None  # CUDA_MPS_CLIENT_PRIORITY
    mps_dir: str = MPS_DIR

    @property
    def directory(self) -> str:
        """The device's directory: ``pipe/``, ``log/``, the daemon's and the clients' records."""
        return posixpath.join(self.mps_dir, self.device)

    @property
    def pipe_dir(self) -> str:
        return posixpath.join(self.directory, "pipe")

    @property
    def log_dir(self) -> str:
        return posixpath.join(self.directory, "log")


def daemon_env(device: str, pipe_dir: str, log_dir: str) -> dict[str, str]:
    """The whole environment of a device's control daemon (and of ``quit`` sent to it)."""
    return {
        "CUDA_VISIBLE_DEVICES": device,
        PIPE: pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": log_dir,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }


def _for_device(rules: Iterable[tuple[str, object]], uuid: str, index: int) -> object | None:
    """A rule's value for one device: its UUID's, else its index's (as the container numbers its
    devices), else the one for every device (the shim's order)."""
    found = dict(rules)
    for scope in (uuid, str(index), ""):
        if scope in found:
            return found[scope]
    return None


def with_configured(
    backend: tuple[tuple[str, str], ...], configured: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    """A container's backend rules: its own (``NVC_SHARE_BACKEND``, any form) replace the
    configuration's ``sharing.backend`` whole; without them, the configuration's."""
    return backend or tuple(("" if gpu == "all" else gpu, name) for gpu, name in configured)


def client(
    request: Mapping[str, tuple[tuple[str, object], ...]],
    devices: tuple[str, ...],
    binaries: Iterable[str],
    container_id: str,
    uid: int,
    mps_dir: str = MPS_DIR,
) -> MpsClient | None:
    """The MPS client a shared container is (``request``: its ShareRequest as a mapping of its
    rules; ``devices``: its GPUs' and MIG devices' UUIDs, as it numbers them; ``binaries``: the
    driver's, host paths), or None when none of its devices is ``mps``."""
    mps = [uuid for index, uuid in enumerate(devices) if _for_device(request["backend"], uuid, index) == "mps"]
    if not mps:
        return None
    if len(devices) > 1:
        raise ContainerError(
            f"{', '.join(mps)}: sharing backend mps serves a container one device (its processes reach one "
            f"MPS daemon), this container has {len(devices)}: {', '.join(devices)}"
        )
    found = {posixpath.basename(path): path for path in binaries}
    for name in (CONTROL, SERVER):
        if name not in found:
            raise ContainerError(
                f"{mps[0]}: sharing backend mps, but the driver has no {name} (choose backend timeslice for this GPU)"
            )
    values = {field: _for_device(request[field], mps[0], 0) for field in ("compute", "weight", "memory", "priority")}
    priority = values["priority"]
    return MpsClient(
        container_id=container_id,
        device=mps[0],
        control=found[CONTROL],
        uid=uid,
        compute=values["compute"],  # type: ignore[arg-type]
        weight=values["weight"],  # type: ignore[arg-type]
        memory=values["memory"],  # type: ignore[arg-type]
        priority=None if priority is None else PRIORITY_OF_CLASS[str(priority)],
        mps_dir=mps_dir,
    )


def thread_percentage(mps: MpsClient) -> int | None:
    """The active thread percentage: the compute cap; None: no limit."""
    return mps.compute if mps.compute is not None and mps.compute < 100 else None


def duty_cycle(mps: MpsClient, other_weights: Iterable[int]) -> int | None:
    """The part of the time (percent) a container without a cap launches, the shim's compute cap
    (:func:`weight_duty`); None: no limit (the heaviest, a weight alone, a container with a cap: its thread
    percentage)."""
    if mps.weight is None or thread_percentage(mps) is not None:
        return None
    return weight_duty(mps.weight, other_weights)


def weight_duty(weight: int, other_weights: Iterable[int]) -> int | None:
    """The duty cycle of a weight below the heaviest among the device's clients now: the part that splits
    a pair by their weights at PLANNED_OVERLAP (1:3: 40 %), rounded up; None for the heaviest. Meanwhile
    the heavier run alone at their full rate and pay nothing per launch, and when both run their kernels
    overlap: on the H100 it kept more of MPS's own sum than a thread ceiling at the weights' share of the
    SMs (docs/performance.md). It follows the clients as they come and go (:func:`rebalanced`)."""
    ratio = max([weight, *other_weights]) / weight
    if ratio <= 1:
        return None
    return math.ceil(100 * 100 / (100 + (ratio - 1) * PLANNED_OVERLAP / 2))


def rebalanced(text: str, weight: int, other_weights: Iterable[int], origin: str) -> str | None:
    """A running client's limits file (``text``, as :func:`client_lines` completed it) with the duty cycle
    of its ``weight`` (0: none) among the device's clients now; None when that changes nothing. Its memory
    limit and MPS lines stay; a client with a thread percentage (a cap) has no duty cycle."""
    limits = share.parse_limits(text, origin)
    mps_env = dict(limits.mps)
    duty = None if not weight or THREADS in mps_env else weight_duty(weight, other_weights)
    new = share.mps_limits_text(limits.request, origin) + _duty_line(duty) + limits_lines(mps_env)
    return None if new == text else new


def _duty_line(duty: int | None) -> str:
    return "" if duty is None else f"{dict(share.LIMITS_KEYS)['compute']}={duty}\n"


def client_env(mps: MpsClient) -> dict[str, str]:
    """The CUDA_MPS_* variables of the container's processes (the device is their device 0: the
    only one the daemon shows them)."""
    env = {PIPE: CONTAINER_PIPE_DIR}
    threads = thread_percentage(mps)
    if threads is not None:
        env[THREADS] = str(threads)
    if mps.memory is not None:
        env[PINNED] = pinned_limit(mps.memory)
    if mps.priority is not None:
        env[CLIENT_PRIORITY] = str(mps.priority)
    return env


def pinned_limit(memory: int) -> str:
    """MPS's pinned device memory limit for a memory limit of ``memory`` bytes on the client's device 0
    (its only one), with its context's room on top (CONTEXT_RESERVE_MIB)."""
    return f"0={max(1, memory // _MIB) + CONTEXT_RESERVE_MIB}M"


def limits_lines(env: Mapping[str, str]) -> str:
    """The limits file's lines that make the shim set ``env`` (native/shim/base/config.c: ``mps.NAME=VALUE``)."""
    return "".join(f"mps.{name}={value}\n" for name, value in env.items())


def client_lines(mps: MpsClient, other_weights: Iterable[int]) -> str:
    """What the container's limits file gets once its daemon is known: its duty cycle as the shim's
    compute cap, and its MPS variables."""
    return _duty_line(duty_cycle(mps, other_weights)) + limits_lines(client_env(mps))
