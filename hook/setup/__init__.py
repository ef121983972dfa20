"""Registering nvc-py with the engines (podman's and CRI-O's hooks.d, containerd, docker) and the
hook server's units; what the package's maintainer scripts and `make uninstall` undo."""
