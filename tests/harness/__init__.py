"""Container test harness: rootfs builder, OCI bundles, runc, podman and containerd drivers."""
