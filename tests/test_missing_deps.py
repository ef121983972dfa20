"""tools/missing_deps.py (``make pip-deps``): the requirements pip would read, judged as pip judges them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import missing_deps  # noqa: E402


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A function installing a distribution NAME at VERSION (its metadata only) where this interpreter finds it."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(name: str, version: str) -> None:
        info = tmp_path / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"  # as pip names it
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")

    return install


def test_a_pre_release_is_below_its_release(installed) -> None:  # noqa: ANN001
    """2.0rc1 does not satisfy >=2.0 (the old regex read it as (2, 0) and said nothing was missing)."""
    installed("nvc-fake-dist", "2.0rc1")
    assert missing_deps.missing(["nvc-fake-dist>=2.0"]) == ["nvc-fake-dist>=2.0"]
    assert missing_deps.missing(["nvc-fake-dist>=2.0rc1", "nvc-fake-dist>=1.9,<3"]) == []


def test_names_specifiers_and_markers_as_pip_reads_them(installed) -> None:  # noqa: ANN001
    installed("Nvc_Fake.Other", "1.10")
    assert missing_deps.missing(["nvc-fake-other>=1.9", "NVC_FAKE_OTHER~=1.10", "nvc.fake.other!=1.10"]) == [
        "nvc.fake.other!=1.10"
    ]
    assert missing_deps.missing(["nvc-fake-absent>=1", 'nvc-fake-absent2; python_version < "3"']) == [
        "nvc-fake-absent>=1"
    ]
    with pytest.raises(SystemExit, match="cannot read requirement 'nvc fake >= 1'"):
        missing_deps.missing(["nvc fake >= 1"])


def test_the_lists_are_those_of_setup_cfg_and_pyproject() -> None:
    names = {Requirement(text).name for text in missing_deps.requirements()}
    assert {"click", "pyyaml", "pytest", "packaging", "setuptools", "wheel"} <= names
    assert {Requirement(text).name for text in missing_deps.build_requirements()} == {"setuptools", "wheel"}
    assert "pytest" not in {Requirement(text).name for text in missing_deps.runtime_requirements()}
    assert missing_deps.missing(missing_deps.requirements()) == []  # the suite runs in an environment that has them
