"""Fuzz target: the device-list and capability grammar, and the requirement grammar: ``--device``
and NVIDIA_VISIBLE_DEVICES selectors (nvc.plan.selection.parse, then select() against two GPUs, one
with MIG devices), NVIDIA_DRIVER_CAPABILITIES and IMEX channel lists, NVIDIA_REQUIRE_* expressions
(nvc.plan.requirements) checked against a driver's facts. Each line of the input is one value;
its first character says which grammar reads it."""

from __future__ import annotations

from target import fuzz, instrumented

with instrumented():
    from nvc.containerenv import DRIVER_CAPABILITIES, Policy, parse_imex_channels
    from nvc.discover.procfs import ProcGpu
    from nvc.errors import NvcError
    from nvc.model import capabilities
    from nvc.model.devices import MigDevice
    from nvc.plan import fromenv, requirements, selection

GPUS = (
    ProcGpu(0, 0, "NVIDIA H100", "GPU-11111111-2222-4333-8444-555555555500", "00000000:17:00.0"),
    ProcGpu(
        1,
        1,
        "NVIDIA A100",
        "GPU-11111111-2222-4333-8444-555555555501",
        "00000000:65:00.0",
        (
            MigDevice(0, 1, 0, "MIG-aaaaaaaa-2222-4333-8444-555555555500"),
            MigDevice(1, 2, 0, "MIG-aaaaaaaa-2222-4333-8444-555555555501"),
        ),
    ),
)
FACTS = (
    {"cuda": "12.4", "driver": "550.54.15", "arch": "9.0", "brand": "Tesla"},
    {"cuda": "13.0", "driver": "580.95.05", "arch": None, "brand": None},
)


def _devices(text: str) -> None:
    selection.select(GPUS, selection.parse(text))


def _capabilities(text: str) -> None:
    capabilities.check(text.split(","))
    fromenv.gpu_request({"NVIDIA_VISIBLE_DEVICES": "all", DRIVER_CAPABILITIES: text}, policy=Policy())


def _requirement(text: str) -> None:
    requirements.check([requirements.parse_requirement(text)], FACTS)


def _imex(text: str) -> None:
    parse_imex_channels([text])


GRAMMARS = (_devices, _capabilities, _requirement, _imex)


def one(data: bytes) -> None:
    for line in data.decode("utf-8", "surrogateescape").split("\n"):
        if not line:
            continue
        try:
            GRAMMARS[ord(line[0]) % len(GRAMMARS)](line[1:])
        except NvcError:
            pass


if __name__ == "__main__":
    fuzz(one, (NvcError,))
