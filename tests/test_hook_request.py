"""The NVIDIA_* environment grammar, table-driven: what a container's spec asks for."""

from __future__ import annotations

import re

import pytest

from nvc.containerenv import Policy, parse_env
from nvc.errors import InputError
from nvc.model.capabilities import CAPABILITIES
from nvc.plan.fromenv import gpu_request
from nvc.plan.request import Request

ALL = CAPABILITIES
DEFAULT = ("compute", "utility")
VOL = Policy(accept_volume_mounts=True)
STRICT = Policy(accept_envvar_when_unprivileged=False)


def dev_mount(name: str, source: str = "/dev/null") -> dict[str, str]:
    return {"source": source, "destination": f"/var/run/nvidia-container-devices/{name}", "type": "bind"}


# (case id, env, mounts, privileged, policy, expected devices / None for driver-only / "NOGPU",
#  expected capabilities, expected requirements)
CASES = [
    ("unset-modern", {}, [], False, Policy(), "NOGPU", None, None),
    ("unset-legacy-all", {"CUDA_VERSION": "9.0"}, [], False, Policy(), ("all",), ALL, ("cuda>=9.0",)),
    (
        "unset-legacy-but-require-cuda",
        {"CUDA_VERSION": "9.0", "NVIDIA_REQUIRE_CUDA": "cuda>=9.0"},
        [],
        False,
        Policy(),
        "NOGPU",
        None,
        None,
    ),
    (
        "legacy-empty-require",
        {"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": ""},
        [],
        False,
        Policy(),
        ("all",),
        ALL,
        ("cuda>=11.8",),
    ),
    ("empty", {"NVIDIA_VISIBLE_DEVICES": ""}, [], False, Policy(), "NOGPU", None, None),
    ("void", {"NVIDIA_VISIBLE_DEVICES": "void"}, [], False, Policy(), "NOGPU", None, None),
    ("void-in-list", {"NVIDIA_VISIBLE_DEVICES": "0,void"}, [], False, Policy(), "NOGPU", None, None),
    ("none", {"NVIDIA_VISIBLE_DEVICES": "none"}, [], False, Policy(), None, DEFAULT, ()),
    ("all", {"NVIDIA_VISIBLE_DEVICES": "all"}, [], False, Policy(), ("all",), DEFAULT, ()),
    ("all-in-list", {"NVIDIA_VISIBLE_DEVICES": "0,all"}, [], False, Policy(), ("all",), DEFAULT, ()),
    ("one", {"NVIDIA_VISIBLE_DEVICES": "1"}, [], False, Policy(), ("1",), DEFAULT, ()),
    ("list-trimmed", {"NVIDIA_VISIBLE_DEVICES": " 0 , 1 ,,"}, [], False, Policy(), ("0", "1"), DEFAULT, ()),
    ("uuid", {"NVIDIA_VISIBLE_DEVICES": "GPU-1234"}, [], False, Policy(), ("GPU-1234",), DEFAULT, ()),
    ("mig-uuid", {"NVIDIA_VISIBLE_DEVICES": "MIG-abcd"}, [], False, Policy(), ("MIG-abcd",), DEFAULT, ()),
    ("mig-index", {"NVIDIA_VISIBLE_DEVICES": "1:0"}, [], False, Policy(), ("1:0",), DEFAULT, ()),
    (
        "legacy-explicit-none",
        {"CUDA_VERSION": "12.4.1", "NVIDIA_VISIBLE_DEVICES": "none"},
        [],
        False,
        Policy(),
        None,
        ALL,
        ("cuda>=12.4",),
    ),
    (
        "legacy-explicit-caps",
        {"CUDA_VERSION": "12.4", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
        [],
        False,
        Policy(),
        ("all",),
        ("utility",),
        ("cuda>=12.4",),
    ),
    (
        "legacy-disable-require",
        {"CUDA_VERSION": "12.4", "NVIDIA_DISABLE_REQUIRE": "1"},
        [],
        False,
        Policy(),
        ("all",),
        ALL,
        (),
    ),
    (
        "caps-all",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "all"},
        [],
        False,
        Policy(),
        ("0",),
        ALL,
        (),
    ),
    (
        "caps-list",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video, graphics"},
        [],
        False,
        Policy(),
        ("0",),
        ("graphics", "video"),
        (),
    ),
    (
        "caps-empty-default",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": ""},
        [],
        False,
        Policy(),
        ("0",),
        DEFAULT,
        (),
    ),
    (
        "caps-case",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "UTILITY"},
        [],
        False,
        Policy(),
        ("0",),
        ("utility",),
        (),
    ),
    (
        "caps-intersected",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "all"},
        [],
        False,
        Policy(supported_capabilities=frozenset({"utility", "compute"})),
        ("0",),
        DEFAULT,
        (),
    ),
    (
        "require-cuda",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"},
        [],
        False,
        Policy(),
        ("0",),
        DEFAULT,
        ("cuda>=12.0",),
    ),
    (
        "require-many-sorted",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_ARCH": "arch>=8.0"},
        [],
        False,
        Policy(),
        ("0",),
        DEFAULT,
        ("arch>=8.0", "cuda>=12.0"),
    ),
    (
        "require-jetpack-ignored",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_JETPACK": "csv-mounts=all"},
        [],
        False,
        Policy(),
        ("0",),
        DEFAULT,
        (),
    ),
    (
        "disable-require-env",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "true"},
        [],
        False,
        Policy(),
        ("0",),
        DEFAULT,
        (),
    ),
    (
        "disable-require-policy",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0"},
        [],
        False,
        Policy(disable_require=True),
        ("0",),
        DEFAULT,
        (),
    ),
    (
        "disable-require-false",
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "false"},
        [],
        False,
        Policy(),
        ("0",),
        DEFAULT,
        ("cuda>=99.0",),
    ),
    ("unprivileged-env-refused", {"NVIDIA_VISIBLE_DEVICES": "0"}, [], False, STRICT, "NOGPU", None, None),
    ("privileged-env-accepted", {"NVIDIA_VISIBLE_DEVICES": "0"}, [], True, STRICT, ("0",), DEFAULT, ()),
    ("volumes-ignored-by-default", {}, [dev_mount("0")], False, Policy(), "NOGPU", None, None),
    ("volumes", {}, [dev_mount("0"), dev_mount("GPU-9")], False, VOL, ("0", "GPU-9"), DEFAULT, ()),
    ("volumes-over-env", {"NVIDIA_VISIBLE_DEVICES": "all"}, [dev_mount("1")], False, VOL, ("1",), DEFAULT, ()),
    ("volume-not-devnull", {}, [dev_mount("0", source="/etc/passwd")], False, VOL, "NOGPU", None, None),
    (
        "volumes-unprivileged-strict",
        {"NVIDIA_VISIBLE_DEVICES": "0"},
        [dev_mount("1")],
        False,
        Policy(accept_volume_mounts=True, accept_envvar_when_unprivileged=False),
        ("1",),
        DEFAULT,
        (),
    ),
]


@pytest.mark.parametrize(
    ("env", "mounts", "privileged", "policy", "devices", "caps", "reqs"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_env_grammar(env, mounts, privileged, policy, devices, caps, reqs) -> None:
    req = gpu_request(env, mounts, privileged, policy)
    if devices == "NOGPU":
        assert req is None
        return
    assert isinstance(req, Request)
    assert (tuple(s.text for s in req.selectors) or None) == devices  # None: driver only
    assert req.capabilities == frozenset(caps)
    assert tuple(r.text for r in req.requirements) == reqs


def test_table_has_at_least_30_cases() -> None:
    assert len(CASES) >= 30


def test_ignored_request_is_reported() -> None:
    warnings: list[str] = []
    assert gpu_request({"NVIDIA_VISIBLE_DEVICES": "0"}, [], False, STRICT, warnings) is None
    assert warnings == [
        "NVIDIA_VISIBLE_DEVICES ignored: unprivileged container and accept-envvar-when-unprivileged is false"
    ]
    assert gpu_request({"NVIDIA_VISIBLE_DEVICES": "0"}, [], True, STRICT, warnings) is not None
    assert len(warnings) == 1


def test_unknown_capability_is_an_error_naming_it() -> None:
    with pytest.raises(InputError, match="NVIDIA_DRIVER_CAPABILITIES: unknown capability 'turbo'"):
        gpu_request({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,turbo"})


@pytest.mark.parametrize("name", ["MIG_CONFIG", "MIG_MONITOR"])
def test_mig_variables_only_for_privileged(name: str) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0", f"NVIDIA_{name}_DEVICES": "all"}
    with pytest.raises(InputError, match=f"cannot set {name}_DEVICES in non privileged container"):
        gpu_request(env)
    req = gpu_request(env, privileged=True)
    assert req is not None and getattr(req, name.lower()) is True
    with pytest.raises(InputError, match=f"NVIDIA_{name}_DEVICES: only 'all' is supported \\(got '0'\\)"):
        gpu_request({**env, f"NVIDIA_{name}_DEVICES": "0"}, privileged=True)


def test_imex_channels() -> None:
    base = {"NVIDIA_VISIBLE_DEVICES": "0"}
    assert gpu_request({**base, "NVIDIA_IMEX_CHANNELS": "3,1,1"}).imex_channels == (1, 3)
    assert gpu_request({**base, "NVIDIA_IMEX_CHANNELS": "all"}).imex_channels == ()
    with pytest.raises(InputError, match="unsupported IMEX channel value '1048576'"):
        gpu_request({**base, "NVIDIA_IMEX_CHANNELS": "1048576"})
    mounts = [{"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/imex/5"}]
    assert gpu_request(base, mounts, policy=VOL).imex_channels == (5,)


def test_parse_env_last_wins_and_keeps_equals_in_values() -> None:
    assert parse_env(["A=1", "B=x=y", "A=2", "BROKEN"]) == {"A": "2", "B": "x=y"}


def test_bad_legacy_cuda_version() -> None:
    with pytest.raises(InputError, match="CUDA_VERSION"):
        gpu_request({"CUDA_VERSION": "latest"})


UNICODE_DIGITS = ["\u00b2", "\u0663", "\uff13", "1\u00b2"]  # superscript two, Arabic-Indic three, fullwidth three


@pytest.mark.parametrize(
    "digits", [*UNICODE_DIGITS, "9" * 4400], ids=["sup2", "arabic3", "fullwidth3", "1sup2", "4400"]
)
def test_numbers_are_ascii_and_bounded(digits: str) -> None:
    """str.isdigit() takes these; int() refuses some (``²``, 4400 digits) and reads others as
    numbers no one meant: all are refused with one InputError or DeviceError, never a ValueError."""
    from nvc.errors import DeviceError, shown
    from nvc.plan import requirements, selection

    base = {"NVIDIA_VISIBLE_DEVICES": "0"}
    with pytest.raises(InputError, match=f"unsupported IMEX channel value {re.escape(shown(digits))}$"):
        gpu_request({**base, "NVIDIA_IMEX_CHANNELS": digits})
    with pytest.raises(InputError, match="CUDA_VERSION: invalid version"):
        gpu_request({"CUDA_VERSION": f"{digits}.0"})
    for text in (digits, f"0:{digits}", f"{digits}:0"):
        with pytest.raises(DeviceError, match="unknown device"):
            selection.parse(text)
    with pytest.raises(InputError, match="invalid version"):
        requirements.parse_requirement(f"cuda>={digits}")


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(InputError) as err:
        gpu_request({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "\x1b[31m" + "q" * 10_000})
    message = str(err.value)
    assert "'\\x1b[31mqqq" in message and "... (+9805 more characters)" in message and len(message) < 500
