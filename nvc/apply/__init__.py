"""Applying a plan: the thin layer with the side effects. File-descriptor based mounts on paths
resolved inside the rootfs, the sandboxed ldconfig, the device cgroup (v1 files, v2 eBPF).

Runs in the privileged helpers (:mod:`nvc.rpc.container_service`) and never decides what to do:
that comes from :mod:`nvc.plan`. May import nvc's basics, discovery and planning, nothing above.
"""
