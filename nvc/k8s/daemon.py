"""``nvc-py k8s device-plugin``'s main loop: discovery, registration, health, until SIGTERM.

One thread does everything but answering gRPC calls, in ticks of about a second, each the wait
for NVML's XID events in the driver helper:

- NVML: one driver helper (nvc.rpc.driver_service) while the driver stays the same; discovery reuses
  nvc-py's inventory. A driver upgrade (nvc.discover.driverstamp, checked every tick) closes it and
  discovers again, so the new driver's devices are advertised without a restart. NVML that cannot load or fails is one log line: the plugin keeps running,
  advertising no devices (or its devices as unhealthy, once NVML fails later), and tries again every
  ``k8s.nvml-retry`` seconds; it never exits for it, so a node without a working driver has no crash loop.
- The kubelet: a restarted kubelet makes a new ``kubelet.sock`` and empties the directory. A
  socket with a new inode, or an endpoint socket gone, starts every endpoint anew and registers
  it again, so the node's capacity comes back without restarting the plugin.
- Health: critical XIDs (nvc/k8s/health.py says what makes a device healthy again); what the
  kubelet is told also goes to a small file for ``nvc-py exporter`` (nvc/k8s/published.py).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import ExitStack
from typing import Any

from nvc.config import K8s
from nvc.config.options import GlobalOptions
from nvc.discover import driverstamp
from nvc.errors import NvcError
from nvc.k8s import published, resources
from nvc.k8s.health import Health

REGISTER_RETRY_S = 5.0  # the kubelet refused or did not answer a Register
TICK_MS = 1000  # one loop: the longest wait for XID events, and for noticing a new kubelet.sock

log = logging.getLogger("nvc-py.k8s")


def numa_node(bus_id: str) -> int | None:
    """The GPU's NUMA node from sysfs ("00000000:3B:00.0" → /sys/bus/pci/devices/0000:3b:00.0), if known."""
    try:
        with open(f"/sys/bus/pci/devices/{bus_id[-12:].lower()}/numa_node") as f:
            node = int(f.read())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


class Plugin:
    """The daemon's state: the board the endpoints answer from, the driver helper, the endpoints."""

    def __init__(self, opts: GlobalOptions, k8s: K8s, health_file: str) -> None:
        from nvc.k8s import service

        self.service = service
        self.opts, self.k8s = opts, k8s
        self.directory = k8s.device_plugin_dir
        self.health = Health(k8s.ignored_xids, k8s.xid_recovery)
        self.board = service.Board(k8s, self.health)
        self.driver: Any = None  # DriverClient while NVML answers
        self.stack = ExitStack()
        self.retry_at = 0.0
        self.said: dict[str, str] = {}  # topic -> last line logged: the same trouble is told once
        self.endpoints: list[Any] = []
        self.kubelet: tuple[int, int] | None = None  # identity of the kubelet.sock registered with
        self.register_at = 0.0
        self.failed: tuple[int, int] | None = None  # the kubelet.sock a registration last failed on
        self.watched: list[str] | None = None
        self.health_file = health_file
        self.published: published.Published | None = None  # what health_file holds (None: nothing written)
        self.stamp: driverstamp.DriverStamp | None = None  # the driver self.driver was opened on

    def say(self, topic: str, line: str, level: int = logging.WARNING) -> None:
        """Log ``line`` unless it is what was last said about ``topic``."""
        if self.said.get(topic) != line:
            self.said[topic] = line
            log.log(level, "%s", line)

    def publish(self, **changes: Any) -> None:
        """Announce a change to the kubelet (:meth:`service.Board.publish`) and to the exporter (the
        health file, :mod:`nvc.k8s.published`); a file that cannot be written is logged, once."""
        self.board.publish(**changes)
        record = published.this_process(tuple(published.ResourceHealth(*c) for c in self.board.counts()))
        if record is None:
            return
        try:
            published.write(self.health_file, record)
        except OSError as err:
            self.say("health-file", f"cannot write {self.health_file}: {err.strerror}")
            return
        self.published = record

    # ---- NVML ----------------------------------------------------------------------------------

    def discover(self) -> None:
        """Open NVML and advertise what it finds; on failure advertise nothing and try again later."""
        from nvc.discover import inventory
        from nvc.rpc import driver_service

        self.stamp = driverstamp.take(self.opts.root, self.opts.ldcache)
        try:
            driver = self.stack.enter_context(driver_service.open_driver(self.opts.root, self.opts.user, events=True))
            inv = inventory.from_snapshot(driver.snapshot())
            topology = driver.topology()
        except NvcError as err:
            self.stack.close()
            self.retry_at = time.monotonic() + self.k8s.nvml_retry
            self.say(
                "nvml", f"NVML unavailable ({err}): advertising no devices; trying again every {self.k8s.nvml_retry} s"
            )
            if not self.board.resources:
                self.publish(resources=resources.plan((), self.k8s._replace(share_gpus=())))
            else:
                self.publish(all_unhealthy=True)
            return
        # A configuration that names no GPU of this host is an error (exit), not a driver's failure.
        planned = resources.plan(inv.gpus, self.k8s, numa_node, lambda line: self.say("mig", line))
        self.driver = driver
        self.say(
            "nvml",
            f"NVML: driver {inv.driver_version}, {len(inv.gpus)} GPUs: "
            + ", ".join(f"{r.name}={len(r.units)}" for r in planned),
            logging.INFO,
        )
        self.publish(resources=planned, topology=topology, all_unhealthy=False)

    def driver_changed(self) -> bool:
        """Whether the driver was upgraded since the helper opened it; if so the helper is closed, for
        :meth:`discover` to open the new one at once."""
        now = driverstamp.take(self.opts.root, self.opts.ldcache)
        if self.stamp is None or now == self.stamp:
            return False
        log.info("%s: discovering the devices again", driverstamp.changed(self.stamp, now))
        self.stack.close()
        self.driver = self.watched = None
        self.retry_at = 0.0
        return True

    def watch_events(self) -> None:
        """One tick: wait for critical XIDs, then give devices whose quiet period is over their check."""
        try:
            answer = self.driver.xid_events(TICK_MS)
            if answer["watched"] != self.watched:
                self.watched = answer["watched"]
                log.info(
                    "health: watching critical XIDs of %s; ignored XIDs: %s",
                    ", ".join(self.watched) or "no GPU",
                    ", ".join(map(str, self.k8s.ignored_xids)) or "none",
                )
            now = time.monotonic()
            changed = False
            for event in answer["events"]:
                if self.health.xid(event["uuid"], event["xid"], now):
                    log.warning("health: XID %d on %s: unhealthy", event["xid"], event["uuid"])
                    changed = True
                else:
                    log.info("health: XID %d on %s ignored (k8s.ignored-xids)", event["xid"], event["uuid"])
            due = self.health.due(now)
            if due:
                snap = self.driver.snapshot()
                present = {g.uuid for g in snap.gpus} | {m.uuid for g in snap.gpus for m in g.mig_devices}
                for uuid in due:
                    if self.health.checked(uuid, uuid in present, now):
                        log.info(
                            "health: %s healthy again (no critical XID for %d s, NVML finds it)",
                            uuid,
                            self.k8s.xid_recovery,
                        )
                        changed = True
            if changed:
                self.publish()
        except NvcError as err:
            log.error("NVML failed (%s): every device unhealthy until it answers again", err)
            self.stack.close()
            self.driver = None
            self.watched = None
            self.retry_at = time.monotonic() + self.k8s.nvml_retry
            self.publish(all_unhealthy=True)

    # ---- the kubelet ---------------------------------------------------------------------------

    def registration(self) -> None:
        """(Re)start the endpoints and register them when the kubelet's socket is new or ours are gone."""
        kubelet = self.service.identity(os.path.join(self.directory, self.service.KUBELET_SOCKET))
        if kubelet is None:
            self.say("kubelet", f"waiting for {self.directory}/{self.service.KUBELET_SOCKET}", logging.INFO)
            return
        fresh = kubelet == self.kubelet and self.endpoints and not any(e.gone() for e in self.endpoints)
        if fresh or (kubelet == self.failed and time.monotonic() < self.register_at):
            return  # registered, or refused by this very kubelet a moment ago (a new one is tried at once)
        if self.kubelet is not None:
            log.info("kubelet restarted or our sockets removed: registering again")
        self.stop_endpoints()
        try:
            for resource in self.board.resources.values():
                endpoint = self.service.Endpoint(self.board, resource, self.directory, log)
                self.endpoints.append(endpoint)
                endpoint.start()
                self.service.register(self.directory, endpoint)
                log.info("registered %s (%d devices) on %s", resource.name, len(resource.units), endpoint.path)
        except Exception as err:  # grpc.RpcError, or a socket that cannot be made: try again shortly
            self.stop_endpoints()
            self.register_at = time.monotonic() + REGISTER_RETRY_S
            self.failed = kubelet
            self.say("kubelet", f"registration failed ({_rpc_text(err)}); trying again in {REGISTER_RETRY_S:.0f} s")
            return
        self.kubelet = kubelet
        self.said.pop("kubelet", None)

    def stop_endpoints(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        self.endpoints = []

    # ---- the loop ------------------------------------------------------------------------------

    def run(self, stop: list[int]) -> int:
        """Until ``stop`` holds a signal's number (its command's handlers append it)."""
        try:
            while not stop:
                if self.driver is not None:
                    self.driver_changed()
                if self.driver is None and time.monotonic() >= self.retry_at:
                    self.discover()
                    self.kubelet = None if self.driver is not None else self.kubelet  # new resources: register anew
                self.registration()
                if self.driver is not None:
                    self.watch_events()
                else:
                    time.sleep(TICK_MS / 1000)
            log.info("stopping (%s)", signal.Signals(stop[0]).name)
        finally:
            self.stop_endpoints()
            self.stack.close()
            if self.published is not None:
                published.remove(self.health_file, self.published)
        return 0


def _rpc_text(err: Exception) -> str:
    details = getattr(err, "details", None)
    return f"{err.code().name}: {details()}" if callable(details) and callable(getattr(err, "code", None)) else str(err)


def run(opts: GlobalOptions, k8s: K8s, stop: list[int], health_file: str | None = None) -> int:
    return Plugin(opts, k8s, health_file or published.FILE).run(stop)
