"""Marker libraries: a shared object whose constructor appends a line (pid, parent, executable) to a
marker file in every process that loads it, and the check that an image's libraries load nowhere."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .bundle import make_bundle
from .fakegpus import A100, H100, MIG_2G, MIG_3G, SHOW, uuids

MARKER_SO = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char exe[256] = "?", line[400];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    int fd = open(MARKER, O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (fd >= 0) { int m = snprintf(line, sizeof line, "%d %d %s\n", (int)getpid(), (int)getppid(), exe);
                   write(fd, line, m); close(fd); }
}
"""


def build_marker_library(path: Path, marker: Path, soname: str) -> None:
    src = path.with_suffix(".c")
    src.write_text(MARKER_SO)
    subprocess.run(
        ["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', f"-Wl,-soname,{soname}", "-o", str(path), str(src)],
        check=True,
    )
    src.unlink()


def assert_image_libraries_never_load(runc, rootfs: Path, tmp_path: Path, make_hook, sonames: tuple[str, ...]) -> None:
    """Marker libraries named ``sonames`` in the image's /evil; the hook ``make_hook(/evil)`` gives the
    container all GPUs and none of the markers runs (each would write the marker file)."""
    marker, evil = tmp_path / "marks", rootfs / "evil"
    evil.mkdir()
    for soname in sonames:
        build_marker_library(evil / soname, marker, soname)
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "all"}, hooks={"prestart": [make_hook(evil)]}
    )
    result = runc.create_start(bundle)
    assert result.returncode == 0, result.stderr
    assert uuids(result.stdout) == [H100, A100, MIG_2G, MIG_3G]
    assert not marker.exists(), marker.read_text()
