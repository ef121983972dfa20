"""The native code the tests run: native/'s build, or its build with AddressSanitizer and UndefinedBehaviorSanitizer
(``make sanitize``, native/sanitize/) where $NVC_TEST_SANITIZE is set, so that the same tests run it under them.

A process the sanitized shim is preloaded into loads the ASan runtime first (:func:`preload_env`): it must come first
in the initial library list, and the test programs are not built with it. Leak checking is off there (the test
programs and the fake driver keep what they allocate until they exit). A finding ends the process with its report on
stderr (-fno-sanitize-recover), which fails the test that ran it.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent.parent / "native"
SANITIZED = bool(os.environ.get("NVC_TEST_SANITIZE"))
BUILD = NATIVE / "sanitize" if SANITIZED else NATIVE
SHIM = BUILD / "libnvc-share.so"
HOOK_CLIENT = BUILD / "nvc-py-hook-client"
DRIVER_SNAPSHOT = BUILD / "nvc-py-driver-snapshot"


def build() -> None:
    """The shim, the hook client and the driver helper as the tests run them, by native/Makefile."""
    subprocess.run(["make", "-s", "-C", str(NATIVE), *(["sanitize"] if SANITIZED else [])], check=True)


def build_pure(source: str, out: Path) -> Path:
    """One of the shim's pure C files (no CUDA, no clock: a policy or a reconstruction) built alone into a
    shared object at out, with the shim's include path and warnings as errors, for a test to call through ctypes."""
    subprocess.run(
        ["gcc", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-iquote", str(NATIVE / "shim"), "-o", str(out)]
        + [str(NATIVE / "shim" / source)],
        check=True,
    )
    return out


def c_layout(header: str, struct: str, fields: list[str], out: Path) -> list[int]:
    """The size of `struct <struct>` as the shim's header (a path under native/shim) declares it, then each field's
    offset, as the C compiler lays them out: what a ctypes mirror of the struct must match."""
    program = out.with_suffix(".c")
    offsets = "".join(f'    printf(" %zu", offsetof(struct {struct}, {field}));\n' for field in fields)
    program.write_text(
        f'#include <stddef.h>\n#include <stdio.h>\n#include "{header}"\n'
        f'int main(void)\n{{\n    printf("%zu", sizeof(struct {struct}));\n{offsets}    return 0;\n}}\n'
    )
    subprocess.run(
        ["gcc", "-Wall", "-Werror", "-iquote", str(NATIVE / "shim"), "-o", str(out), str(program)], check=True
    )
    return [int(n) for n in subprocess.run([str(out)], check=True, capture_output=True, text=True).stdout.split()]


@functools.cache
def _asan_runtime() -> str:
    """The compiler's ASan runtime, which native/Makefile's sanitized build links against."""
    found = subprocess.run(
        [os.environ.get("CC", "cc"), "-print-file-name=libasan.so"], check=True, capture_output=True, text=True
    )
    return found.stdout.strip()


def preload_env(library: Path = SHIM, sanitized: bool = SANITIZED) -> dict[str, str]:
    """The environment that preloads the shim (or another library) into a process, with the sanitizers' runtime
    and options where it is sanitized."""
    if not sanitized:
        return {"LD_PRELOAD": str(library)}
    return {
        "LD_PRELOAD": f"{_asan_runtime()} {library}",
        "ASAN_OPTIONS": "detect_leaks=0",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
