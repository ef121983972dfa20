"""``nvc-py doctor``: what a platform engineer runs when a container has no GPU.

Each check reads the host as the engines and the hook will (the driver's /proc files, NVML through
the driver helper, the engines' own configuration chains) and answers in one line: holds, fails
with what to do, or does not apply here (an engine that is not installed). Reading only: a check
changes nothing; ``--run`` starts one small container per registered engine.
"""

from __future__ import annotations

from nvc.records import NamedTuple

OK, FAIL, SKIP = "ok", "fail", "skip"
MARKS = {OK: "✓", FAIL: "✗", SKIP: "-"}


class Check(NamedTuple):
    """One finding: ``status`` OK, FAIL or SKIP; ``fix`` says what to do where it fails."""

    name: str
    status: str
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, FAIL, detail, fix)


def skip(name: str, detail: str) -> Check:
    return Check(name, SKIP, detail)
