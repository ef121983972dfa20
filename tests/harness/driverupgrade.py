"""A driver upgrade on the fake driver (a test double): the two-gpu-mig machine built again at another
driver version, and a driver root whose files, with /proc/driver, are swapped for that version's
while the processes under test run (bind mounts in the test's private mount namespace, which the
processes it starts share: they see the swap as a host sees an upgrade, at the same paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakedriver.activate import bind
from fakedriver.build import FakeDriver, build

from .fakegpus import DRIVER_VERSION

MACHINES = Path(__file__).resolve().parent.parent / "fakedriver" / "machines"
UPGRADED_VERSION = "590.44.01"


@pytest.fixture(scope="session")
def fake_2gpu_upgraded(tmp_path_factory: pytest.TempPathFactory) -> FakeDriver:
    """The two-gpu-mig machine with driver UPGRADED_VERSION."""
    old = f'driver_version: "{DRIVER_VERSION}"'
    text = (MACHINES / "two-gpu-mig.yaml").read_text()
    assert old in text
    out = tmp_path_factory.mktemp("upgraded")
    machine = out / "two-gpu-mig-upgraded.yaml"
    machine.write_text(text.replace(old, f'driver_version: "{UPGRADED_VERSION}"'))
    return build(machine, out)


class Upgradable:
    """A driver root at ``root`` showing ``old``'s files until :meth:`upgrade` shows ``new``'s there
    and ``new``'s /proc/driver at /proc/driver."""

    def __init__(self, root: Path, old: FakeDriver, new: FakeDriver) -> None:
        self.root, self.old, self.new = root, old, new
        bind(old.root, root)

    def upgrade(self) -> None:
        bind(self.new.root, self.root)
        bind(self.new.proc / "driver", "/proc/driver")


@pytest.fixture
def upgradable(active_2gpu, fake_2gpu_upgraded: FakeDriver, tmp_path: Path) -> Upgradable:
    """The fake two-gpu-mig driver active, its root at ``root`` (what the configuration names), ready to
    be upgraded; the mounts go with the test's mount namespace."""
    root = tmp_path / "driver"
    root.mkdir()
    return Upgradable(root, active_2gpu, fake_2gpu_upgraded)
