"""The ``nvc-py-hook`` program's entry point: a call runs without the cyclic garbage collector, as a
server's worker does, and ``serve`` turns it back on (a server lives on)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, no server to hand a call to."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVC_PY_HOOK_SOCKET": "none"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_hook_call_runs_its_stage_without_the_cyclic_collector() -> None:
    """The stage sees the collector off, and garbage in cycles made during it stays uncollected
    until the process exits (as it does in a served call's worker)."""
    result = run_python(
        """
        import gc, sys, weakref
        from nvc.hook import program

        class Node:
            pass

        def stage(argv=None):
            node = Node()
            node.self = node
            ref = weakref.ref(node)
            del node
            gc.collect(0)  # an explicit collection still works; only the automatic ones are off
            print(gc.isenabled(), ref() is None, sys.argv[1:])
            for _ in range(100_000):
                cycle = []
                cycle.append(cycle)
            print(gc.get_count()[0] > 50_000)
            return 3

        program.main = stage
        sys.argv = ["nvc-py-hook", "prestart"]
        program.run()
        """
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == ["False True ['prestart']", "True"]


def test_serve_turns_the_collector_back_on() -> None:
    result = run_python(
        """
        import gc
        from nvc.hook import program
        from nvc.hook.server import loop

        gc.disable()  # as run() leaves it
        loop.serve = lambda socket: print(gc.isenabled(), socket) or 0
        print(program.main(["serve", "--socket", "/run/test.sock"]))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["True /run/test.sock", "0"]
