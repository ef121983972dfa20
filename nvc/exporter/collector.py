"""The exporter's metric families, built from one reading of the host at each scrape
(prometheus_client's custom collector API: no state of its own but the hook log's tally).

Labels are bounded: a container id is the name of a directory root made (escaped and cut all the
same); a device key comes from the container's own region, so one that is not a UUID's (lower-case
letters and digits, dashes; an old MIG UUID's slashes) is shown as ``invalid``; a region has 16 devices at most and
a container's processes are shown only where its own pid namespace has them, at most
:data:`MAX_PROCESSES`, by their host pid. Whatever a container wrote, a label set appears once per
family (the first wins), so the output stays valid. docs/metrics.md describes every metric.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from nvc import __version__
from nvc.commands import sharestatus
from nvc.errors import one_line
from nvc.exporter import hooklog, unixdiag
from nvc.exporter.nvml import GpuMemory, GpuMemoryCache
from nvc.k8s import published
from nvc.records import NamedTuple

MAX_PROCESSES = 32  # per container, the largest users of device memory first
MAX_LABEL = 128  # characters of a label value taken from a file
_DEVICE_KEY = re.compile(r"[0-9a-z][0-9a-z/-]{0,39}")
INVALID = "invalid"


class Reading(NamedTuple):
    """Everything one scrape reports, read at once."""

    containers: Sequence[sharestatus.ContainerShare]
    gpus: Sequence[GpuMemory]
    nvml_ok: bool
    hook: hooklog.Tally
    hook_log_open: bool
    server_up: bool
    installed: str  # the installed nvc-py's version: the code the hook server serves calls with
    plugin: published.Published | None


def device_label(key: str) -> str:
    return key if _DEVICE_KEY.fullmatch(key) else INVALID


def _gpu_device(uuid: str) -> str:
    """A GPU's UUID as a region's device key: without its GPU- or MIG- prefix, lower case."""
    return uuid.split("-", 1)[1].lower() if uuid[:4] in ("GPU-", "MIG-") else uuid.lower()


class _Family:
    """A metric family that takes each label set once."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric
        self.seen: set[tuple[str, ...]] = set()

    def add(self, labels: Sequence[str], value: float) -> None:
        key = tuple(labels)
        if key not in self.seen:
            self.seen.add(key)
            self.metric.add_metric(list(key), value)


def _gauge(name: str, text: str, labels: Sequence[str] = ()) -> _Family:
    return _Family(GaugeMetricFamily(name, text, labels=list(labels)))


def _counter(name: str, text: str, labels: Sequence[str] = ()) -> _Family:
    return _Family(CounterMetricFamily(name, text, labels=list(labels)))


def gpu_families(gpus: Sequence[GpuMemory], nvml_ok: bool) -> Iterator[Metric]:
    labels = ("gpu", "device", "index", "model")
    total = _gauge("nvc_py_gpu_memory_total_bytes", "GPU memory, as NVML reports it.", labels)
    used = _gauge("nvc_py_gpu_memory_used_bytes", "GPU memory in use, as NVML reports it.", labels)
    for gpu in gpus:
        values = (
            one_line(gpu.uuid, MAX_LABEL),
            device_label(_gpu_device(gpu.uuid)),
            str(gpu.index),
            one_line(gpu.model, MAX_LABEL),
        )
        total.add(values, gpu.total)
        used.add(values, gpu.used)
    up = _gauge("nvc_py_nvml_up", "1 when NVML answered the exporter's last read of GPU memory.")
    up.add((), int(nvml_ok))
    yield from (total.metric, used.metric, up.metric)


def _fair_shares(containers: Iterable[sharestatus.ContainerShare]) -> dict[tuple[str, str], float]:
    """(container, device key) -> its weight over the weights of every container busy on that device
    now: the share the weighted scheduler aims at, for those busy with a weight."""
    busy: dict[str, dict[str, int]] = {}
    for c in containers:
        for d in c.devices:
            if d.weight and d.share_percent is not None:
                busy.setdefault(d.key, {}).setdefault(c.id, d.weight)
    return {
        (cid, key): weight / sum(tenants.values()) for key, tenants in busy.items() for cid, weight in tenants.items()
    }


def share_families(containers: Sequence[sharestatus.ContainerShare]) -> Iterator[Metric]:
    per_device = ("container_id", "device")
    count = _gauge("nvc_py_share_containers", "Containers with a GPU-sharing directory on this host.")
    count.add((), len(containers))
    region_ok = _gauge(
        "nvc_py_share_region_ok",
        "1 when the container's shared region could be read "
        "(0: no CUDA process initialised it yet, or the container replaced it).",
        ("container_id",),
    )
    limit = _gauge(
        "nvc_py_share_memory_limit_bytes", "The container's device memory budget (0: unlimited).", per_device
    )
    used = _gauge(
        "nvc_py_share_memory_used_bytes",
        "Device memory the container's processes hold, as its region reports it.",
        per_device,
    )
    process = _gauge(
        "nvc_py_share_process_memory_used_bytes",
        "Device memory of one of the container's processes (host pid; only processes in its own pid namespace).",
        (*per_device, "pid"),
    )
    cap = _gauge("nvc_py_share_compute_limit_ratio", "The container's compute cap (1: none).", per_device)
    weight = _gauge("nvc_py_share_weight", "The container's scheduling weight (weighted containers only).", per_device)
    measured = _gauge(
        "nvc_py_share_measured_ratio",
        "The container's measured share of the GPU while busy, as "
        "its scheduler file reports it (busy weighted or capped containers only).",
        per_device,
    )
    duty = _gauge(
        "nvc_py_share_duty_ratio",
        "The duty cycle (part of the wall time) a weighted container runs in beside a steadily busy heavier one, "
        "as its scheduler file reports it (busy containers in one only).",
        per_device,
    )
    backlog = _gauge(
        "nvc_py_share_backlog_ratio",
        "The part of a busy weighted container's recent looks at its backlog that found its work queued (what lets "
        "its weight hold the others), as its scheduler file reports it.",
        per_device,
    )
    steady = _gauge(
        "nvc_py_share_steady_ratio",
        "The part of a busy weighted container's recent looks that found the previous look's work not yet run (a "
        "steadily busy container: what gives a lighter one beside it a duty cycle), as its scheduler file reports it.",
        per_device,
    )
    fair = _gauge(
        "nvc_py_share_fair_ratio",
        "The share its weight gives the container among the weighted containers busy on the device now.",
        per_device,
    )
    busy = _counter(
        "nvc_py_share_busy_seconds", "GPU time of the container's throttled launches (SM-weighted).", per_device
    )
    throttled = _counter(
        "nvc_py_share_throttled_seconds", "Time the container's launches waited for its share.", per_device
    )
    launches = _counter("nvc_py_share_launches", "Launches seen while throttling was active.", per_device)
    fair_shares = _fair_shares(containers)
    for c in containers:
        cid = one_line(c.id, MAX_LABEL)
        region_ok.add((cid,), int(c.region == "ok"))
        for d in c.devices:
            labels = (cid, device_label(d.key))
            limit.add(labels, d.memory_limit)
            used.add(labels, d.memory_used)
            cap.add(labels, d.compute_percent / 100)
            busy.add(labels, d.busy_s)
            throttled.add(labels, d.throttled_s)
            launches.add(labels, d.launches)
            if d.weight:
                weight.add(labels, d.weight)
            if d.share_percent is not None:
                measured.add(labels, d.share_percent / 100)
            if d.duty_percent:
                duty.add(labels, d.duty_percent / 100)
            if d.weight and d.backlog_percent is not None and d.steady_percent is not None:
                backlog.add(labels, d.backlog_percent / 100)
                steady.add(labels, d.steady_percent / 100)
            if (c.id, d.key) in fair_shares:
                fair.add(labels, fair_shares[(c.id, d.key)])
        running = sorted((p for p in c.processes if p.host_pid), key=lambda p: -sum(p.used.values()))
        for p in running[:MAX_PROCESSES]:
            for key, amount in p.used.items():
                process.add((cid, device_label(key), str(p.host_pid)), amount)
    for family in (
        count,
        region_ok,
        limit,
        used,
        process,
        cap,
        weight,
        measured,
        duty,
        backlog,
        steady,
        fair,
        busy,
        throttled,
        launches,
    ):
        yield family.metric


def hook_families(tally: hooklog.Tally, log_open: bool, server_up: bool, installed: str) -> Iterator[Metric]:
    starts = _counter(
        "nvc_py_hook_starts",
        "Container starts the hook's log records, by outcome and by what ran "
        "the hook (the hook server, or a hook process of its own).",
        ("outcome", "via"),
    )
    for (outcome, via), n in tally.starts.items():
        starts.add((outcome, via), n)
    yield starts.metric
    durations = HistogramMetricFamily(
        "nvc_py_hook_start_duration_seconds", "How long the hook took per container start.", labels=["via"]
    )
    for via in hooklog.VIA:
        counts, cumulative = [], 0
        for bound, n in zip(hooklog.BUCKETS, tally.buckets[via], strict=True):
            cumulative += n
            counts.append((repr(bound), cumulative))
        counts.append(("+Inf", cumulative + tally.over[via]))
        durations.add_metric([via], counts, sum_value=tally.seconds[via])
    yield durations
    junk = _counter("nvc_py_hook_log_junk_lines", "Lines of the hook's log that are not the hook's (skipped).")
    junk.add((), tally.junk)
    log_up = _gauge("nvc_py_hook_log_up", "1 when the exporter has the hook's log open.")
    log_up.add((), int(log_open))
    server = _gauge(
        "nvc_py_hook_server_up",
        "1 when the hook server's socket listens; version: the installed "
        "code, which the server runs every call with (it stops when the code changed).",
        ("version",),
    )
    server.add((one_line(installed, MAX_LABEL),), int(server_up))
    yield from (junk.metric, log_up.metric, server.metric)


def plugin_families(plugin: published.Published | None) -> Iterator[Metric]:
    up = _gauge("nvc_py_device_plugin_up", "1 when a running device plugin publishes its devices' health here.")
    up.add((), int(plugin is not None))
    devices = _gauge(
        "nvc_py_device_plugin_devices",
        "Devices the device plugin advertises, by resource and health, as the kubelet is told.",
        ("resource", "health"),
    )
    for resource in plugin.resources if plugin else ():
        name = one_line(resource.name, MAX_LABEL)
        devices.add((name, "healthy"), resource.healthy)
        devices.add((name, "unhealthy"), resource.unhealthy)
    yield from (up.metric, devices.metric)


def families(reading: Reading) -> Iterator[Metric]:
    build = InfoMetricFamily("nvc_py_exporter_build", "The exporter's own code.")
    build.add_metric([], {"version": __version__})
    yield build
    yield from gpu_families(reading.gpus, reading.nvml_ok)
    yield from share_families(reading.containers)
    yield from hook_families(reading.hook, reading.hook_log_open, reading.server_up, reading.installed)
    yield from plugin_families(reading.plugin)


class Sources(NamedTuple):
    state_dir: str
    hook_log: str | None
    hook_socket: str
    plugin_file: str


class Collector:
    """Reads the host afresh at every scrape; scrapes take turns (the hook log's reader and NVML's
    cache are one each)."""

    def __init__(self, sources: Sources, gpus: GpuMemoryCache | None) -> None:
        self.sources = sources
        self.gpus = gpus
        self.log = hooklog.LogTail(sources.hook_log)
        self.lock = threading.Lock()

    def read(self) -> Reading:
        self.log.read()
        memory = self.gpus.read() if self.gpus else None
        try:
            installed = metadata.version("nvc-py")
        except metadata.PackageNotFoundError:
            installed = "unknown"
        return Reading(
            sharestatus.status(self.sources.state_dir),
            memory.gpus if memory else (),
            bool(memory and memory.ok),
            self.log.tally,
            self.log.open,
            unixdiag.listening(self.sources.hook_socket),
            installed,
            published.read(self.sources.plugin_file),
        )

    def collect(self) -> list[Metric]:
        with self.lock:
            return list(families(self.read()))
