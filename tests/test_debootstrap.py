"""The README's promise on a stock Debian 12: in a minimal Debian root made by debootstrap (Debian's
own /usr/bin/python3, PEP 668 in force), the install steps `make demo` and `make test` start with
(`make deps build`) succeed, `nvc-py --version` and a fake-driver `info` (`make try`) answer, and
after `setup podman|server|containerd|docker` and a CDI spec, `make uninstall` removes all of it again.

The root is made from the network (deb.debian.org, and PyPI for the Python dependencies); the
bare debootstrap result is cached as a tarball under /var/cache/nvc-py-test (not /tmp: the suite
leaves /tmp as it found it) so that later runs on the same machine skip debootstrap; without it
the test makes one. The chroot runs in a private mount namespace (/proc, /dev, /sys bound in),
which vanishes with it; the root itself is in the test's temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path("/var/cache/nvc-py-test")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What a user has before the README's commands: make, and a clone (the tree is copied in here).
INCLUDE = "make,ca-certificates"
TARBALL = CACHE / f"debootstrap-{SUITE}-minbase-{hashlib.sha256(INCLUDE.encode()).hexdigest()[:12]}.tar"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CHROOT_ENV = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
              "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive"]
# In the chroot, from the copy of the tree: the README's install steps, then what a user would type.
SCRIPT = """set -eu
update-ca-certificates > /dev/null
cd /src/nvc-py
make deps build
test "$(head -n1 /usr/lib/nvc-py/nvc-py-python)" = "#!/usr/lib/nvc-py/venv/bin/python -IS"
/usr/lib/nvc-py/venv/bin/python -c 'import sys; assert sys.base_prefix == "/usr", sys.base_prefix'
test "$(readlink /usr/local/bin/nvc-py)" = /usr/lib/nvc-py/nvc-py
echo "== version"; nvc-py --version
echo "== runtime"; nvc-py-runtime --version | head -n1
echo "== try"; make -s try CMD="nvc-py info"
if test -f /etc/containerd/config.toml; then cp /etc/containerd/config.toml /tmp/containerd.toml; fi
nvc-py setup podman && nvc-py setup server && nvc-py setup containerd && nvc-py setup docker
make -s try CMD="nvc-py cdi generate --output /etc/cdi/nvidia.yaml"
for f in /usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json /etc/systemd/system/nvc-py-hook.socket \
         /etc/containerd/conf.d/99-nvc-py.toml /etc/cdi/nvidia.yaml /etc/docker/daemon.json; do test -f $f; done
test "$(readlink /usr/bin/nvidia-container-runtime-hook)" = /usr/lib/nvc-py/nvc-py-hook
echo "== uninstall"; make -s uninstall
for f in /usr/lib/nvc-py /usr/local/bin/nvc-py /usr/local/bin/nvc-py-hook /usr/local/bin/nvc-py-runtime \
         /usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json /usr/share/containers/oci/hooks.d/oci-nvc-py-poststop.json \
         /etc/systemd/system/nvc-py-hook.socket /etc/systemd/system/nvc-py-hook.service \
         /etc/containerd/conf.d/99-nvc-py.toml /etc/cdi/nvidia.yaml /etc/docker/daemon.json \
         /usr/bin/nvidia-container-runtime-hook; do ! test -e $f -o -L $f || { echo "left: $f"; exit 1; }; done
if test -f /tmp/containerd.toml; then cmp /etc/containerd/config.toml /tmp/containerd.toml
else test ! -e /etc/containerd/config.toml; fi
echo "== uninstalled"
"""


def _run(argv: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv[:3]} failed ({result.returncode}):\n{result.stdout[-6000:]}\n" \
                                   f"{result.stderr[-4000:]}"
    return result


def _base_root(root: Path) -> bool:
    """A bare Debian 12 root at ``root``, from the cached tarball (True) or made by debootstrap (False)."""
    root.mkdir()
    if TARBALL.is_file():
        _run(["tar", "-xpf", str(TARBALL), "--numeric-owner", "-C", str(root)], 300)
        return True
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    _run([debootstrap, "--variant=minbase", f"--include={INCLUDE}", SUITE, str(root), MIRROR], 900)
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = TARBALL.with_name(f".{TARBALL.name}.{os.getpid()}")
    try:
        _run(["tar", "-cf", str(partial), "--numeric-owner", "-C", str(root), "."], 300)
        os.replace(partial, TARBALL)
    finally:
        partial.unlink(missing_ok=True)
    return False


def _copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked files, not ignored build outputs)."""
    files = _run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], 60).stdout
    dest.mkdir(parents=True)
    for name in filter(None, files.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def test_readme_install_on_a_stock_debian_12(tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    started = time.monotonic()
    root = tmp_path / "root"
    hit = _base_root(root)
    shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
    # The test machine's certificate authorities, added the Debian way (a network that inspects TLS
    # has its own; PyPI is reached over it): Debian's pip trusts the system's bundle.
    shutil.copy2(HOST_CA_BUNDLE, root / "usr/local/share/ca-certificates/nvc-test-host.crt")
    _copy_tree(root / "src/nvc-py")
    # The root bound onto itself: a chroot whose / is a mount point, as make try's unshare wants.
    mounts = (f"mount --bind {root} {root} && mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && "
              f"mount --rbind /sys {root}/sys && exec {' '.join(CHROOT_ENV)} chroot {root} /bin/sh -c \"$0\"")
    result = _run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, SCRIPT], 1200)
    out = result.stdout
    assert "== version\nnvc-py " in out
    assert "== runtime\nnvc-py-runtime " in out
    info = out.split("== try\n", 1)[1]
    assert "FAKE NVIDIA driver" in info and "NVIDIA H100 80GB HBM3" in info and "NVIDIA A100-SXM4-40GB" in info
    assert out.rstrip().endswith("== uninstalled")
    assert "externally-managed-environment" not in result.stderr and "break-system-packages" not in out
    line = f"DEBOOTSTRAP install+info ok in {time.monotonic() - started:.0f} s (cache: {'hit' if hit else 'miss'})"
    print(line)
    summary_line(line)
