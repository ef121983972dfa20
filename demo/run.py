"""`make demo`: show the GPUs nvc-py sees on this machine.

On a host with an NVIDIA driver it asks the real driver; otherwise it builds the fake driver
of the test suite (a test double: two fake GPUs, one with MIG) and shows that, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _show(args: list[str], env: dict[str, str] | None = None) -> None:
    shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    print(f"$ {shown + ' ' if shown else ''}{' '.join(args)}", flush=True)
    subprocess.run(args, check=True, env={**os.environ, **(env or {})})
    print(flush=True)


def main() -> int:
    if Path("/proc/driver/nvidia/version").exists():
        print("== nvc-py demo: real NVIDIA driver found on this host ==\n", flush=True)
        _show(["nvc-py", "info"])
        _show(["nvc-py", "list"])
        return 0

    print("== nvc-py demo: no NVIDIA driver on this host; using the built-in FAKE driver (test double) ==\n",
          flush=True)
    sys.path.insert(0, str(REPO / "tests"))
    from fakedriver.activate import activate
    from fakedriver.build import build

    with tempfile.TemporaryDirectory(prefix="nvc-demo-") as tmp:
        fake = build(REPO / "tests" / "fakedriver" / "machines" / "two-gpu-mig.yaml", Path(tmp))
        with activate(fake):
            _show(["nvc-py", "--root", str(fake.root), "info"])
            _show(["nvc-py", "--root", str(fake.root), "list"])
            # The fake nvidia-smi runs on the host here, so point the loader at the fake root.
            _show([str(fake.root / "usr" / "bin" / "nvidia-smi"), "-L"],
                  env={"LD_LIBRARY_PATH": str(fake.root / "usr" / "lib" / "x86_64-linux-gnu")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
