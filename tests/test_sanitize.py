"""`make sanitize` passes: the shim and the hook client built with AddressSanitizer and UndefinedBehaviorSanitizer,
and the native tests run with them (the Makefile's SANITIZE_TESTS, tests/harness/native.py), so CI fails on a
memory error or undefined behaviour they run into. The suite has built and installed the tree already: this runs the
sanitized build and its tests only (`make sanitize-tests`), in a pytest session of their own under this test's
temporary directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness import native

REPO = Path(__file__).resolve().parent.parent


def test_make_sanitize_passes(tmp_path: Path) -> None:
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "sanitize-tests", f"PYTEST_FLAGS=-q --basetemp={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-4000:]
    assert " passed" in done.stdout, done.stdout[-2000:]


def test_the_sanitized_build_is_instrumented() -> None:
    """What the sanitized tests preload and run carries both sanitizers (a plain build would pass them vacuously)."""
    subprocess.run(["make", "-s", "-C", str(native.NATIVE), "sanitize"], check=True)
    for name in ("libnvc-share.so", "nvc-py-hook-client", "nvc-py-driver-snapshot"):
        built = native.NATIVE / "sanitize" / name
        symbols = subprocess.run(["nm", "-D", str(built)], check=True, capture_output=True, text=True).stdout
        assert "__asan_report_load" in symbols and "__ubsan_handle_" in symbols, built


def test_a_finding_in_a_preloaded_library_fails_its_process(tmp_path: Path) -> None:
    """Preloaded as the sanitized shim is, a library built with the sanitizers that reads past a heap block ends
    the process it is loaded into, with ASan's report: the arrangement make sanitize relies on reports."""
    source, library = tmp_path / "over.c", tmp_path / "libover.so"
    source.write_text(
        "#include <stdlib.h>\nvolatile int sink;\n"
        "__attribute__((constructor)) static void over(void)\n"
        "{\n    int *p = malloc(4 * sizeof *p);\n    sink = p[4];\n    free(p);\n}\n"
    )
    flags = ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-shared", "-fPIC"]
    subprocess.run(["cc", *flags, "-o", str(library), str(source)], check=True)
    env = {"PATH": "/usr/bin:/bin", **native.preload_env(library, sanitized=True)}
    done = subprocess.run(["true"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "heap-buffer-overflow" in done.stderr, done.stderr
    clean = {"PATH": "/usr/bin:/bin", **native.preload_env(native.NATIVE / "sanitize" / "libnvc-share.so", True)}
    subprocess.run(["make", "-s", "-C", str(native.NATIVE), "sanitize"], check=True)
    assert subprocess.run(["true"], env=clean, capture_output=True, text=True, timeout=30).returncode == 0
