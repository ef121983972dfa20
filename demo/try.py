"""`make try`: a shell in which nvc-py answers from the fake driver of the test suite (a test double).

The fake driver (two fake GPUs, the second with two MIG devices) is built in a temporary
directory and shown at the real /proc and /dev paths in a private mount namespace of this
process, which the shell inherits; a configuration file naming the fake driver root is what
every nvc-py command reads there (``$NVC_PY_CONFIG``), so ``nvc-py info``, ``list``, ``cdi
generate`` and ``configure --dry-run $ROOTFS`` answer without flags. /run/nvc-py is a private
tmpfs and ``NVC_PY_HOOK_SOCKET=none``: no host hook server answers (it would see the real
driver) and none is started. Nothing of it outlives the shell: the namespace goes with its last
process and the directory is removed. Nothing obtained there is a GPU result.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
MACHINE = REPO / "tests" / "fakedriver" / "machines" / "two-gpu-mig.yaml"
BANNER = """\
== nvc-py try: FAKE NVIDIA driver (a test double from tests/fakedriver: two fake GPUs, the second with
   two MIG devices; nothing here is a GPU result), in a private mount namespace of this shell ==
   nvc-py info | nvc-py list | nvc-py cdi generate | nvc-py configure --dry-run -c -u $ROOTFS
   (configuration: $NVC_PY_CONFIG, root: {root}); exit to leave, everything is removed then.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", help="run this shell command there instead of an interactive shell")
    args = parser.parse_args()

    from fakedriver.activate import enter_private_tmpfs, show
    from fakedriver.build import build

    if os.geteuid() != 0:
        print("make try: needs root (mount namespaces, device nodes)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="nvc-try-") as tmp:
        work = Path(tmp)
        fake = build(MACHINE, work / "fake")
        config = work / "config.yaml"
        config.write_text(f"root: {fake.root}\nlog: {{file: {work / 'hook.log'}}}\n")
        rootfs = work / "rootfs"
        for sub in ("etc", "usr/lib", "usr/bin", "dev", "proc"):
            (rootfs / sub).mkdir(parents=True)
        (work / "staging").mkdir()
        env = {
            **os.environ,
            "NVC_PY_CONFIG": str(config),
            "NVC_PY_HOOK_SOCKET": "none",
            "ROOTFS": str(rootfs),
            "PS1": "(nvc-py try: FAKE driver) \\w# ",
        }

        def private_fake() -> None:
            """In the shell's process before it starts: its own mount namespace (gone with it; this
            process never leaves its own, so a chroot stays a chroot) with the fake driver shown."""
            enter_private_tmpfs("/run/nvc-py")
            show(fake, work / "staging")

        created = not os.path.isdir("/run/nvc-py")
        print(BANNER.format(root=fake.root), flush=True)
        shell = ["sh", "-c", args.command] if args.command else [os.environ.get("SHELL", "/bin/sh"), "-i"]
        try:
            return subprocess.run(shell, env=env, cwd=tmp, preexec_fn=private_fake).returncode  # noqa: PLW1509
        finally:
            if created:  # made empty for the shell's tmpfs: not the host's to keep
                os.rmdir("/run/nvc-py")


if __name__ == "__main__":
    sys.exit(main())
