"""The README's promise on a stock Debian 12: in a minimal Debian root made by debootstrap (Debian's
own /usr/bin/python3, PEP 668 in force), the install steps `make demo` and `make test` start with
(`make deps build`) succeed, `nvc-py --version` and a fake-driver `info` (`make try`) answer, and
after `setup podman|server|containerd|docker` and a CDI spec, `make uninstall` removes all of it again.

The root comes from harness.debroot (debootstrap's result, cached); the install needs the network
(PyPI for the Python dependencies). The chroot runs in a private mount namespace (/proc, /dev, /sys
bound in), which vanishes with it; the root itself is in the test's temporary directory.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from harness import debroot

# What a user has before the README's commands: make, and a clone (the tree is copied in here).
INCLUDE = "make,ca-certificates"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
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


def test_readme_install_on_a_stock_debian_12(tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    started = time.monotonic()
    root = tmp_path / "root"
    hit = debroot.base_root(root, INCLUDE)
    shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
    # The test machine's certificate authorities, added the Debian way (a network that inspects TLS
    # has its own; PyPI is reached over it): Debian's pip trusts the system's bundle.
    shutil.copy2(HOST_CA_BUNDLE, root / "usr/local/share/ca-certificates/nvc-test-host.crt")
    debroot.copy_tree(root / "src/nvc-py")
    result = debroot.chroot(root, SCRIPT, 1200)
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
