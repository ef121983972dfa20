"""OCI runtime hook and runtime integrations (Podman hooks.d, CDI, containerd).

Installed as ``nvc.hook``.
"""
