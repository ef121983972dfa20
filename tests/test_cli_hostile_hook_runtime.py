"""``nvc-py-hook``'s stages (the OCI hooks, the CDI hooks, the server, what a container's env says) and
``nvc-py-runtime``, called with hostile values (by hand: neither is a click program).

The table, the rules and how each case runs: tests/harness/clihostile.py.

Test double: the GPUs are the fake driver's (tests/fakedriver); nothing here is a GPU result.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.clihostile import (
    ENV_VALUES,
    HOOK,
    HOOK_ENV_NAMES,
    NVC_PY,
    PATH_VALUES,
    RUNTIME,
    WORD_VALUES,
    Case,
    run_phases,
    table_dir,  # noqa: F401  (fixture)
)
from harness.clihostile import asking_gpu_with as _asking_gpu_with
from harness.clihostile import hook_state as _state
from harness.clihostile import scratch_bundle as _bundle


def hook_cases() -> tuple[list[Case], list[Case]]:
    bases: list[Case] = []
    rest: list[Case] = []
    for program in ([HOOK], [NVC_PY, "hook"]):
        label = " ".join(Path(w).name if i == 0 else w for i, w in enumerate(program))
        for flag in ("--help", "-h"):
            for mode in ("pipe", "closed", "full", "both-closed"):
                rest.append(
                    Case(
                        f"{label} {flag} | {mode}",
                        lambda s, p=program, f=flag: [*p, f],
                        stdout=mode,
                        must_succeed=mode == "pipe",
                        must_fail_output=mode != "pipe",
                    )
                )
        for stage in ("prestart", "poststart", "poststop"):
            name = f"{label} {stage}"
            argv = lambda s, p=program, st=stage: [*p, st]  # noqa: E731
            bases.append(Case(name, argv, stdin=_state, must_succeed=True))
            for mode in ("closed", "full", "both-closed", "stdin-closed"):
                rest.append(Case(f"{name} | {mode}", argv, stdin=_state, stdout=mode))
    # The CDI hooks: links and ld cache in the case's own rootfs (the state names its bundle, no pid).
    cdi = {
        "create-symlinks": ("--link", lambda v: b"libx.so::/" + v),
        "update-ldcache": ("--folder", lambda v: b"/" + v),
    }
    for stage, (option, make) in cdi.items():
        argv = lambda s, st=stage, o=option, m=make: [HOOK, st, o, m(b"lib")]  # noqa: E731
        bases.append(Case(f"nvc-py-hook {stage}", argv, stdin=_state, must_succeed=True))
        for value_name, value in WORD_VALUES.items():
            rest.append(
                Case(
                    f"nvc-py-hook {stage} {option}={value_name}",
                    lambda s, st=stage, o=option, m=make, v=value: [HOOK, st, o, m(os.fsencode(v(s)))],
                    stdin=_state,
                )
            )
    for value_name, value in PATH_VALUES.items():
        rest.append(
            Case(
                f"nvc-py-hook serve --socket={value_name}",
                lambda s, v=value: [HOOK, "serve", "--socket", v(s)],
                daemon=True,
            )
        )
    # What a container's env says, for a container asking for GPU 0 (refused before anything is done).
    for name in HOOK_ENV_NAMES:
        for value_name, value in ENV_VALUES.items():
            rest.append(
                Case(
                    f"nvc-py-hook prestart env {name}={value_name}",
                    lambda s: [HOOK, "prestart"],
                    stdin=_state,
                    setup=_asking_gpu_with(name, value),
                )
            )
    return bases, rest


def test_hook_stages(active_2gpu, table_dir: Path) -> None:
    run_phases(hook_cases, table_dir, active_2gpu.root)


def runtime_cases() -> tuple[list[Case], list[Case]]:
    bases: list[Case] = []
    rest: list[Case] = []
    for flag in ("--help", "-h", "--version", "-v"):
        for mode in ("pipe", "closed", "full", "both-closed"):
            rest.append(
                Case(
                    f"nvc-py-runtime {flag} | {mode}",
                    lambda s, f=flag: [RUNTIME, f],
                    stdout=mode,
                    must_succeed=mode == "pipe",
                    must_fail_output=mode != "pipe",
                )
            )
    create = lambda s: [RUNTIME, "create", "--bundle", str(_bundle(s)), "ctr"]  # noqa: E731
    bases.append(Case("nvc-py-runtime create", create, must_succeed=True))
    for mode in ("closed", "full", "both-closed", "stdin-closed"):
        rest.append(Case(f"nvc-py-runtime create | {mode}", create, stdout=mode))
    for value_name, value in PATH_VALUES.items():
        rest.append(
            Case(
                f"nvc-py-runtime create --bundle={value_name}",
                lambda s, v=value: [RUNTIME, "create", "--bundle", v(s), "ctr"],
            )
        )
        # The log gets the error of a create that fails (a bundle without config.json).
        rest.append(
            Case(
                f"nvc-py-runtime --log={value_name} create (failing)",
                lambda s, v=value: [RUNTIME, "--log", v(s), "create", "--bundle", s.path("adir"), "ctr"],
            )
        )
    for name in HOOK_ENV_NAMES:
        for value_name, value in ENV_VALUES.items():
            rest.append(
                Case(f"nvc-py-runtime create env {name}={value_name}", create, setup=_asking_gpu_with(name, value))
            )
    return bases, rest


def test_runtime(active_2gpu, table_dir: Path) -> None:
    run_phases(runtime_cases, table_dir, active_2gpu.root)
