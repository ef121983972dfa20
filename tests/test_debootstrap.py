"""The README's promise on a stock Debian 12: in a minimal Debian root made by debootstrap (Debian's
own /usr/bin/python3, PEP 668 in force), the install steps `make demo` and `make test` start with
(`make deps build`) succeed, `nvc-py --version` and a fake-driver `info` (`make try`) answer, and
after `setup podman|server|containerd|docker`, a CDI spec and a hook call served by the server it
starts, `make uninstall` removes all of it again: the root's tree is as it was before the install
(apt's packages installed, the first step of `make deps`), the hook's log aside, which
`make uninstall PURGE=1` removes too.

The root comes from harness.debroot: debootstrap's result with `make apt-deps`' packages installed,
cached for a week while what decides them is the same (the Makefile's package lists, tools/deps.sh);
the install needs the network (PyPI for the Python dependencies). The chroot runs in a private mount
namespace (/proc, /dev, /sys bound in), which vanishes with it; the test works on an overlay over the
cached root, whose changes stay in its temporary directory.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from harness import debroot, progress

# What a user has before the README's commands: make, and a clone (the tree is copied in here).
INCLUDE = "make,ca-certificates"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TREE = "src/nvc-py"  # the clone, in the root: left out of the comparison (its build outputs)
APT = """set -eu
update-ca-certificates > /dev/null
cd /src/nvc-py
make apt-deps
"""
# In the chroot, from the copy of the tree: the README's install steps, then what a user would type.
SCRIPT = """set -eu
cd /src/nvc-py
make deps build
test "$(head -n1 /usr/lib/nvc-py/nvc-py-python)" = "#!/usr/lib/nvc-py/venv/bin/python -IS"
/usr/lib/nvc-py/venv/bin/python -c 'import sys; assert sys.base_prefix == "/usr", sys.base_prefix'
test "$(readlink /usr/local/bin/nvc-py)" = /usr/lib/nvc-py/nvc-py
echo "== version"; nvc-py --version
echo "== runtime"; nvc-py-runtime --version | head -n1
echo "== try"; make -s try CMD="nvc-py info"
if test -f /etc/containerd/config.toml; then cp /etc/containerd/config.toml /root/containerd.toml; fi
nvc-py setup podman && nvc-py setup server && nvc-py setup containerd && nvc-py setup docker
make -s try CMD="nvc-py cdi generate --output /etc/cdi/nvidia.yaml"
for f in /usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json /etc/systemd/system/nvc-py-hook.socket \
         /etc/containerd/conf.d/99-nvc-py.toml /etc/cdi/nvidia.yaml /etc/docker/daemon.json; do test -f $f; done
test "$(readlink /usr/bin/nvidia-container-runtime-hook)" = /usr/lib/nvc-py/nvc-py-hook
echo "== hook"
mkdir -p /root/bundle/rootfs
echo '{"ociVersion": "1.0.2", "process": {"args": ["true"], "cwd": "/"}, "root": {"path": "rootfs"}}' \
    > /root/bundle/config.json
printf '{"ociVersion":"1.0.2","id":"uninstall","status":"creating","pid":%d,"bundle":"/root/bundle"}' $$ |
    nvc-py-hook prestart
test -S /run/nvc-py/hook.sock && grep -q '"outcome":"no-gpu".*"via":"server"' /var/log/nvc-py.log
echo "== uninstall"; make -s uninstall
for f in /usr/lib/nvc-py /usr/local/bin/nvc-py /usr/local/bin/nvc-py-hook /usr/local/bin/nvc-py-runtime \
         /usr/share/containers/oci/hooks.d/oci-nvc-py-hook.json /usr/share/containers/oci/hooks.d/oci-nvc-py-poststop.json \
         /etc/systemd/system/nvc-py-hook.socket /etc/systemd/system/nvc-py-hook.service \
         /etc/containerd/conf.d/99-nvc-py.toml /etc/cdi/nvidia.yaml /etc/docker/daemon.json \
         /usr/bin/nvidia-container-runtime-hook /run/nvc-py; do ! test -e $f -o -L $f || { echo "left: $f"; exit 1; }; done
if test -f /root/containerd.toml; then cmp /etc/containerd/config.toml /root/containerd.toml
else test ! -e /etc/containerd/config.toml; fi
rm -rf /root/bundle /root/containerd.toml
echo "== uninstalled"
"""
PURGE = "cd /src/nvc-py && make -s uninstall PURGE=1\n"


def test_readme_install_on_a_stock_debian_12(tmp_path: Path, summary_line) -> None:  # noqa: ANN001
    started = time.monotonic()

    def apt_deps(root: Path) -> None:
        shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
        # The test machine's certificate authorities, added the Debian way (a network that inspects TLS
        # has its own; PyPI is reached over it): Debian's pip trusts the system's bundle.
        shutil.copy2(HOST_CA_BUNDLE, root / "usr/local/share/ca-certificates/nvc-test-host.crt")
        debroot.copy_tree(root / TREE)
        with progress.phase("make apt-deps in the Debian root (apt-get from deb.debian.org)"):
            debroot.chroot(root, APT, 1200)

    what = "make apt-deps' packages"
    with debroot.prepared_root(tmp_path, INCLUDE, what, _apt_inputs(), apt_deps, (TREE,)) as (root, hit):
        shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
        debroot.copy_tree(root / TREE)
        _install_and_uninstall(root)
    line = (
        f"DEBOOTSTRAP install+info+uninstall ok in {time.monotonic() - started:.0f} s, tree as before "
        f"(apt-deps' root cache: {'hit' if hit else 'miss'})"
    )
    print(line)
    summary_line(line)


def _install_and_uninstall(root: Path) -> None:
    before = debroot.tree(root, (TREE,))
    # Its own pid namespace, the script its PID 1: the hook starts a server there as on a host.
    with progress.phase("make deps build, nvc-py's commands, setup, a served hook call, make uninstall in the root"):
        result = debroot.chroot(root, SCRIPT, 1200, own_pids=True)
    out = result.stdout
    assert "== version\nnvc-py " in out
    assert "== runtime\nnvc-py-runtime " in out
    info = out.split("== try\n", 1)[1]
    assert "FAKE NVIDIA driver" in info and "NVIDIA H100 80GB HBM3" in info and "NVIDIA A100-SXM4-40GB" in info
    assert out.rstrip().endswith("== uninstalled")
    assert "externally-managed-environment" not in result.stderr and "break-system-packages" not in out
    assert debroot.differences(before, debroot.tree(root, (TREE,))) == ["var/log/nvc-py.log"]
    debroot.chroot(root, PURGE, 60)
    assert debroot.differences(before, debroot.tree(root, (TREE,))) == []


def _apt_inputs() -> str:
    """What decides `make apt-deps`' result in the root: the script that runs it, its rule and package
    lists in the Makefile, tools/deps.sh, the certificate authorities added."""
    makefile = (debroot.REPO / "Makefile").read_text()
    rules = re.findall(r"^APT_\w+ :=(?:.*\\\n)*.*$|^apt-deps:.*\n(?:\t.*\n)*", makefile, re.MULTILINE)
    assert len(rules) == 3, rules
    sources = [(debroot.REPO / "tools/deps.sh").read_text(), Path(HOST_CA_BUNDLE).read_text()]
    return "\n".join([APT, *rules, *sources])
