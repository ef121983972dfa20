"""Kubernetes Dynamic Resource Allocation (resource.k8s.io/v1): ``nvc-py k8s dra-driver``.

The driver publishes the node's GPUs and MIG devices as ResourceSlices (:mod:`.slices`, through the
API server: :mod:`.kubeapi`), registers its kubelet plugin and serves the kubelet's DRA calls
(:mod:`.service`, the protocols in ``dra.proto`` and ``registration.proto``), and prepares each
allocated claim as a CDI spec of its own (:mod:`.claims`, with the sharing parameters of
:mod:`.params`), remembered across restarts (:mod:`.checkpoint`). :mod:`.driver` is the daemon.
gRPC loads only when the driver runs.
"""
