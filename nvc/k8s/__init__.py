"""Kubernetes: the device plugin (``nvc-py k8s device-plugin``) advertising whole GPUs, MIG devices
and GPU shares to the kubelet, and answering each container with what nvc-py's hook needs.

Only :mod:`nvc.k8s.command` is imported by the CLI at start-up; gRPC and protobuf load when the
plugin runs (:mod:`nvc.k8s.service`).
"""
