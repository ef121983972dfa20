"""libnvc-share (native/) under test on the fake driver: the shim and the test programs built
(``programs``), programs run under it with a private region directory (``share``), and the sizes and
the NVML memory line the tests read.

Test double only: nothing here is a GPU result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakedriver.libraries import INCLUDES

from . import native

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
FAKE_SRC = TESTS / "fakedriver" / "src"
PROGRAMS = TESTS / "share_programs"
SHIM = native.SHIM
MIB = 1 << 20
GIB = 1 << 30


def foreground() -> None:
    """preexec_fn of a program whose timings a test reads: ahead of the machine's other load (nice 0),
    whose CPU time would otherwise land in them (the fake GPU's kernels are simulated; the programs'
    host work and the shim's waits are not)."""
    os.nice(-15)


def probe_started(programs: dict[str, Path], env: dict[str, str], *work: str) -> subprocess.Popen:
    """cuda_probe doing `work` on its device 0 in the background, ahead of the machine's other load, its
    output piped."""
    return subprocess.Popen(
        [str(programs["cuda_probe"]), "init", "ctx", "0", *work],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=foreground,
    )


# what a process's launches waited for, logged by the shim at exit (NVC_SHARE_LOG=2): the GPU bench's parser
sys.path.insert(0, str(TESTS / "gpu"))
import sharegpu  # noqa: E402

WAITS_LOG = sharegpu.SHIM_EXIT


def launches_logged(err: str) -> tuple[int, int]:
    """What a process's shim logged at exit (NVC_SHARE_LOG=2): its throttled launches, and those that ran free."""
    found = sharegpu.shim_exit_of(err)
    assert found, err
    return found.launches, found.free


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shim (built by its Makefile) and the test programs, once per session (tests/conftest.py
    registers it); no test writes them."""
    native.build()
    out = tmp_path_factory.mktemp("share_programs")
    built = {
        "cuda_probe": [FAKE_SRC / "cuda_probe.c"],
        "share_app": [PROGRAMS / "share_app.c"],
        "hold_lock": [PROGRAMS / "hold_lock.c"],
        "sched_sim": [PROGRAMS / "sched_sim.c", REPO / "native/shim/scheduling/schedpolicy.c"],
        "limits_parse": [PROGRAMS / "limits_parse.c", REPO / "native/shim/base/config.c"],
    }
    for name, sources in built.items():
        subprocess.run(
            ["gcc", "-O1", "-Wall", "-Werror", *INCLUDES, "-o", str(out / name), *map(str, sources), "-ldl"], check=True
        )
    return {name: out / name for name in built}


@pytest.fixture
def share(programs, active_2gpu, tmp_path):
    """Runs programs under the shim with a private region directory; env is the limits."""
    libdir = active_2gpu.root / "usr" / "lib" / "x86_64-linux-gnu"

    class Share:
        dir = tmp_path / "share"
        root = active_2gpu.root

        def env(self, limits: dict[str, str]) -> dict[str, str]:
            self.dir.mkdir(exist_ok=True)
            return {
                "PATH": os.environ["PATH"],
                "LD_LIBRARY_PATH": str(libdir),
                **native.preload_env(),
                "NVC_SHARE_DIR": str(self.dir),
                "FAKE_CUDA_CONTEXT_MIB": "0",
                **limits,
            }

        def run(
            self, program: str, *ops: object, limits: dict[str, str] | None = None, timeout: float = 20
        ) -> tuple[list[list[str]], str]:
            result = subprocess.run(
                [str(programs[program]), *map(str, ops)],
                env=self.env(limits or {}),
                capture_output=True,
                text=True,
                timeout=timeout,
                preexec_fn=foreground,
            )
            assert result.returncode == 0, result.stderr
            return [line.split() for line in result.stdout.splitlines()], result.stderr

        def probe(self, *ops: object, limits: dict[str, str] | None = None) -> list[list[str]]:
            return self.run("cuda_probe", "init", "ctx", 0, *ops, limits=limits)[0][2:]

        def holder(self, *ops: object, limits: dict[str, str]) -> subprocess.Popen:
            """share_app doing ops, then holding its allocations until killed."""
            proc = subprocess.Popen(
                [str(programs["share_app"]), "init", *map(str, ops), "hold"],
                env=self.env(limits),
                stdout=subprocess.PIPE,
                text=True,
            )
            for line in proc.stdout:
                if line.startswith("holding"):
                    return proc
                assert line.split()[1] == "0", line
            raise AssertionError("holder exited early")

    return Share()


def meminfo(line: list[str]) -> tuple[int, int]:
    assert line[:2] == ["meminfo", "CUDA_SUCCESS"], line
    return int(line[2]), int(line[3])


def tenant(
    share,
    programs,
    sched: Path,
    name: str,
    weight: int,
    launches: int,
    cap: int | None = None,
    host_us: int | None = None,
    gpu: Path | None = None,
    burst: int = 0,
    kernel_us: int = 1000,
    log: bool = False,
    klass: str | None = None,
) -> subprocess.Popen:
    """A tenant's process with plain LD_PRELOAD use (its own share directory, its scheduler file
    ``name`` in ``sched``) launching 1 ms kernels on its own fake GPU 0 back to back, then synchronising;
    or with host_us, waiting for each and then spending host_us on its host (a training-like loop); or
    with burst, `launches` steps of a framework: burst kernels, host_us after each, one wait. With gpu,
    the fake GPU is the one shared by the processes naming that file (FAKE_CUDA_SHARED_GPU), and weight
    0 runs it without the shim. With log, its shim says at exit where its launches waited; klass: its
    latency class (NVC_SHARE_PRIORITY)."""
    limits = {
        "NVC_SHARE_WEIGHT": str(weight),
        "FAKE_CUDA_KERNEL_US": str(kernel_us),
        "NVC_SHARE_SCHED_DIR": str(sched),
        "NVC_SHARE_TENANT": name,
        **({"NVC_SHARE_COMPUTE": str(cap)} if cap else {}),
        **({"FAKE_CUDA_SHARED_GPU": str(gpu)} if gpu else {}),
        **({"NVC_SHARE_LOG": "2"} if log else {}),
        **({"NVC_SHARE_PRIORITY": klass} if klass else {}),
    }
    env = dict(share.env(limits), NVC_SHARE_DIR=str(share.dir.parent / name))
    if not weight:
        del env["LD_PRELOAD"]
    work = (
        ["burst", str(launches), str(burst), str(host_us)]
        if burst
        else ["launch", str(launches), "264", "128", "sync"]
        if host_us is None
        else ["steps", str(launches), "264", "128", str(host_us)]
    )
    return probe_started(programs, env, *work)


def wall_s(proc: subprocess.Popen, timeout: float) -> float:
    """Seconds a tenant took to launch its kernels and see them done; it must exit 0 in time."""
    return wall_and_log(proc, timeout)[0]


def wall_and_log(proc: subprocess.Popen, timeout: float) -> tuple[float, str]:
    """wall_s's seconds, and what the tenant's shim logged (its waits, with log=True)."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (proc.returncode, err)
    lines = [line.split() for line in out.splitlines()]
    return sum(int(line[2]) for line in lines[2:]) / 1e6, err
