"""``nvc-py k8s dra-driver``'s daemon: discovery, ResourceSlices, the kubelet plugin, until SIGTERM.

Discovery asks NVML once through the confined driver helper (as ``nvc-py list`` does) and makes
nvc-py's CDI spec of the node (devices by UUID), which claims are prepared from; NVML that cannot
answer is one log line and another try every ``RETRY_S``, with nothing served meanwhile. Slices are
published then and checked again every ``--resync`` seconds (made again if someone removed or changed
them). A driver upgrade (nvc.discover.driverstamp, checked every tick and before a claim is prepared)
discovers again and publishes the new driver's slices; claims prepared after it get its files. Prepared claims live in the checkpoint (nvc.k8s.dra.checkpoint); a claim is prepared under a
lock, its CDI spec written before the checkpoint, the checkpoint before the kubelet hears of it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any

from nvc.config.options import GlobalOptions
from nvc.discover import driverstamp
from nvc.errors import InputError, NvcError
from nvc.k8s.dra import checkpoint, claims, kubeapi, slices
from nvc.records import NamedTuple

RETRY_S = 30.0
TICK_S = 1.0
RESOURCE_API = "/apis/resource.k8s.io/v1"

log = logging.getLogger("nvc-py.k8s.dra")


class Settings(NamedTuple):
    driver: str  # the DRA driver name, e.g. gpu.nvc-py.io
    node: str
    kubelet_dir: str  # the kubelet's --root-dir
    cdi_dir: str
    volume_mounts: bool  # k8s.device-list-strategy: volume-mounts (shared claims' devices and limits)
    resync_s: float
    config_path: str | None  # the configuration file the CDI spec's hooks read

    @property
    def plugin_dir(self) -> str:
        return os.path.join(self.kubelet_dir, "plugins", self.driver)

    @property
    def registry_socket(self) -> str:
        return os.path.join(self.kubelet_dir, "plugins_registry", f"{self.driver}-reg.sock")


class Driver:
    def __init__(self, opts: GlobalOptions, settings: Settings, api: kubeapi.Client) -> None:
        self.opts, self.settings, self.api = opts, settings, api
        self.lock = threading.Lock()
        self.checkpoint_path = os.path.join(settings.plugin_dir, checkpoint.FILE)
        self.claims: checkpoint.Claims = checkpoint.load(self.checkpoint_path)
        self.devices: dict[str, slices.Device] = {}
        self.node_spec: dict[str, Any] | None = None
        self.stamp: driverstamp.DriverStamp | None = None  # the driver node_spec was made of
        self.said: dict[str, str] = {}

    def say(self, topic: str, line: str, level: int = logging.WARNING) -> None:
        if self.said.get(topic) != line:
            self.said[topic] = line
            log.log(level, "%s", line)

    # ---- discovery and slices ------------------------------------------------------------------

    def discover(self) -> bool:
        from nvc import cdi
        from nvc.rpc import driver_service
        from nvc.system import programs

        stamp = driverstamp.take(self.opts.root, self.opts.ldcache)
        try:
            inv = driver_service.inventory(self.opts.root, self.opts.user)
            spec = cdi.generate(
                self.opts.root,
                self.opts.ldcache,
                self.opts.user,
                "uuid",
                programs.installed_program(programs.HOOK_SCRIPT),
                programs.hook_env(self.settings.config_path),
            )
        except NvcError as err:
            self.say("nvml", f"NVML unavailable ({err}): trying again in {RETRY_S:.0f} s")
            return False
        found = slices.devices(inv.gpus, inv.driver_version, inv.cuda_version)
        with self.lock:
            self.devices = {d.name: d for d in found}
            self.node_spec, self.stamp = spec, stamp
        self.say(
            "nvml",
            f"NVML: driver {inv.driver_version}, devices: "
            + (", ".join(f"{d.name}={d.uuid}" for d in found) or "none"),
            logging.INFO,
        )
        return True

    def driver_changed(self) -> bool:
        """Whether the driver was upgraded since the devices were discovered (said once)."""
        now = driverstamp.take(self.opts.root, self.opts.ldcache)
        if self.stamp is None or now == self.stamp:
            return False
        self.say("driver", f"{driverstamp.changed(self.stamp, now)}: discovering the devices again", logging.INFO)
        return True

    def publish(self) -> None:
        """Make the API server's slices of this node's pool say what was discovered."""
        s = self.settings
        try:
            owner = None
            try:
                owner = slices.node_owner(self.api.request("GET", f"/api/v1/nodes/{s.node}"))
            except kubeapi.ApiError as err:
                self.say("node", f"node {s.node}: {err}: slices published without an owner")
            existing = (
                self.api.request(
                    "GET",
                    f"{RESOURCE_API}/resourceslices",
                    query={"fieldSelector": f"spec.nodeName={s.node},spec.driver={s.driver}"},
                ).get("items")
                or []
            )
            change = slices.changes(existing, s.node, s.driver, list(self.devices.values()), owner)
            for item in change.create:
                self.api.request("POST", f"{RESOURCE_API}/resourceslices", item)
            for item in change.update:
                self.api.request("PUT", f"{RESOURCE_API}/resourceslices/{item['metadata']['name']}", item)
            for name in change.delete:
                self.api.request("DELETE", f"{RESOURCE_API}/resourceslices/{name}")
        except kubeapi.ApiError as err:
            self.say("publish", f"publishing ResourceSlices failed: {err}; trying again in {s.resync_s:.0f} s")
            return
        if change.create or change.update or change.delete:
            log.info(
                "published %d devices in ResourceSlices %s",
                len(self.devices),
                ", ".join(i["metadata"]["name"] for i in change.create + change.update),
            )
        self.said.pop("publish", None)

    # ---- the kubelet's calls -------------------------------------------------------------------

    def prepare(self, ref: claims.ClaimRef) -> tuple[claims.Prepared, ...]:
        if self.driver_changed() and not self.discover():  # the loop notices within a tick: not the old files meanwhile
            raise InputError(f"claim {ref}: the driver changed and its devices are not discovered yet (NVML)")
        with self.lock:
            known = self.claims.get(ref.uid)
            if known is not None:
                return known[2]  # prepared before (the kubelet asks again after a restart)
            if self.node_spec is None:
                raise InputError(f"claim {ref}: the node's devices are not discovered yet (NVML)")
            claim = self.api.request("GET", f"{RESOURCE_API}/namespaces/{ref.namespace}/resourceclaims/{ref.name}")
            plan = claims.plan(
                claim,
                ref,
                self.settings.driver,
                self.settings.node,
                self.devices,
                self.node_spec,
                self.settings.volume_mounts,
            )
            path = os.path.join(self.settings.cdi_dir, claims.spec_file(self.settings.driver, ref.uid))
            try:
                os.makedirs(self.settings.cdi_dir, 0o755, exist_ok=True)
                checkpoint.write_atomically(path, json.dumps(plan.spec, indent=1).encode() + b"\n", 0o644)
                self.claims[ref.uid] = (ref, path, plan.devices)
                checkpoint.save(self.checkpoint_path, self.claims)
            except OSError as err:
                self.claims.pop(ref.uid, None)
                checkpoint.remove(path)
                raise InputError(f"claim {ref}: cannot write {err.filename}: {err.strerror}") from None
            log.info("prepared %s (%s): %s", ref, ref.uid, " ".join(i for d in plan.devices for i in d.cdi_ids))
            return plan.devices

    def unprepare(self, ref: claims.ClaimRef) -> None:
        with self.lock:
            known = self.claims.get(ref.uid)
            if known is None:
                return  # never prepared here, or unprepared already: nothing to undo
            try:
                checkpoint.remove(known[1])
                del self.claims[ref.uid]
                checkpoint.save(self.checkpoint_path, self.claims)
            except OSError as err:
                self.claims[ref.uid] = known
                raise InputError(f"claim {ref}: cannot remove {err.filename}: {err.strerror}") from None
            log.info("unprepared %s (%s): removed %s", ref, ref.uid, known[1])

    # ---- the loop ------------------------------------------------------------------------------

    def run(self, stop: list[int]) -> int:
        """Until ``stop`` holds a signal's number (its command's handlers append it)."""
        from nvc.k8s.dra import service

        os.makedirs(self.settings.plugin_dir, 0o750, exist_ok=True)
        served = service.sockets(
            self.settings.driver,
            self.settings.registry_socket,
            os.path.join(self.settings.plugin_dir, "dra.sock"),
            self.prepare,
            self.unprepare,
            log,
        )
        log.info("%d claims prepared before (%s)", len(self.claims), self.checkpoint_path)
        discovered, retry_at, resync_at = False, 0.0, 0.0
        published: driverstamp.DriverStamp | None = None  # the driver the slices were last published for
        try:
            while not stop:
                now = time.monotonic()
                if discovered and self.driver_changed():
                    discovered, retry_at = False, 0.0
                if not discovered and now >= retry_at:
                    discovered, retry_at = self.discover(), now + RETRY_S
                if discovered and (now >= resync_at or self.stamp != published):  # a claim's check rediscovered
                    self.publish()
                    resync_at, published = now + self.settings.resync_s, self.stamp
                if discovered and any(s.gone() for s in served):
                    for socket in served:  # the DRA socket first: the kubelet dials it once registered
                        socket.stop()
                        socket.start()
                    log.info(
                        "serving %s on %s (registration: %s)", self.settings.driver, served[0].path, served[1].path
                    )
                time.sleep(TICK_S)
            log.info("stopping (%s)", signal.Signals(stop[0]).name)
        finally:
            for socket in reversed(served):
                socket.stop()
        return 0
