"""OCI image-layout archives built by hand from a rootfs tarball.

containerd can only import images (no `podman import`-style rootfs import)
and the tests have no registry, so the single-layer image is assembled here:
layer blob, config, manifest, index.json and oci-layout, per the OCI image
spec 1.0. The layer stays uncompressed: hashing 6 MB is cheaper than gzip.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _digest_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def _blob(doc: dict[str, Any]) -> tuple[bytes, str]:
    data = json.dumps(doc, separators=(",", ":")).encode()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def build_oci_archive(rootfs_tar: Path, ref: str, out: Path, cmd: list[str] | None = None) -> Path:
    """Write an OCI image-layout tar at `out` holding `rootfs_tar` as its one layer.

    `ref` ("localhost/nvc-test:debian") goes in the annotation containerd
    uses to name imported images; `cmd`: the image's command (a shell by default).
    """
    layer_digest = _digest_file(rootfs_tar)
    layer_size = rootfs_tar.stat().st_size
    config, config_digest = _blob(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": [PATH_ENV], "Cmd": cmd or ["/bin/sh"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
    )
    manifest, manifest_digest = _blob(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer_size}],
        }
    )
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_TYPE,
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    ).encode()
    with tarfile.open(out, "w") as archive:
        _add_bytes(archive, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_bytes(archive, "index.json", index)
        for digest, data in ((config_digest, config), (manifest_digest, manifest)):
            _add_bytes(archive, "blobs/sha256/" + digest.split(":")[1], data)
        archive.add(rootfs_tar, "blobs/sha256/" + layer_digest.split(":")[1])
    return out
