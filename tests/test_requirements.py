"""Requirement grammar and evaluation, with the reference's vectors."""

from __future__ import annotations

import pytest

from nvc.errors import InputError, RequirementError
from nvc.plan.requirements import check, parse_requirement, version_key

# Reference vectors: driver 550.54.15, CUDA 12.4, brand Tesla, arch 9.0.
FACTS = {"cuda": "12.4", "driver": "550.54.15", "arch": "9.0", "brand": "Tesla"}


@pytest.mark.parametrize(
    ("expr", "ok"),
    [
        ("cuda>=12.0", True),
        ("cuda>=12.6", False),
        ("cuda>=12.6 brand=tesla,driver>=550,driver<551", True),
        ("brand=TESLA", True),
        ("brand!=tesla", False),
        ("arch>=8.0", True),
        ("arch<9", False),
        ("cuda=12.4.0", True),
        ("driver>=550.54.15", True),
        ("driver>550.54.15", False),
        ("CUDA>=12.0,BRAND=Tesla", True),
        ("cuda>=13.0 arch=8.0 brand=geforce", False),
    ],
)
def test_reference_vectors(expr: str, ok: bool) -> None:
    assert parse_requirement(expr).holds(FACTS) is ok


def test_version_compare_is_numeric_and_ignores_trailing_zero() -> None:
    assert version_key("12.10") > version_key("12.9")
    assert version_key("12.4") == version_key("12.4.0.0")
    with pytest.raises(InputError, match="invalid version"):
        version_key("12.x")


@pytest.mark.parametrize("expr", ["foo=1", "cuda~12", "brand>=tesla", "cuda>=abc", "", "   "])
def test_bad_expressions_are_rejected(expr: str) -> None:
    with pytest.raises(InputError):
        parse_requirement(expr)


def test_failure_message_names_first_term_and_hints_for_cuda() -> None:
    with pytest.raises(RequirementError) as err:
        check([parse_requirement("cuda>=12.6 brand=geforce")], [FACTS])
    assert str(err.value) == (
        "requirement error: unsatisfied condition: cuda>=12.6, please update your driver to a newer "
        "version, or use an earlier cuda container"
    )
    with pytest.raises(RequirementError) as err:
        check([parse_requirement("arch>=10.0")], [FACTS])
    assert str(err.value) == "requirement error: unsatisfied condition: arch>=10.0"


def test_each_gpu_must_satisfy_and_unknown_facts_pass() -> None:
    h100 = dict(FACTS)
    a100 = dict(FACTS, arch="8.0")
    req = parse_requirement("arch>=9.0")
    check([req], [h100])
    with pytest.raises(RequirementError):
        check([req], [h100, a100])
    # No GPU selected: arch and brand are unknown and count as satisfied.
    check([req, parse_requirement("brand=quadro")], [{"cuda": "12.4", "driver": "550.54.15"}])
