"""The project's commit messages from the habits of #41 on: a subject under 72 characters, then a blank
line before the body, so that `git log --oneline`, shortlog and every review tool show what a commit
does. Commits before the rule are left as they are."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SINCE = "947014a"  # the commit that added the rule: those after it follow it
MAX_SUBJECT = 71


def _messages() -> list[tuple[str, str]]:
    """(hash, message) of each commit after SINCE on HEAD; skips outside a clone that has SINCE."""
    if (
        subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{SINCE}^{{commit}}"], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip(f"not a clone holding {SINCE} (an archive or a shallow clone)")
    out = subprocess.run(
        ["git", "-C", str(REPO), "log", "--format=%h%x00%B%x01", f"{SINCE}..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [tuple(entry.strip("\n").split("\0", 1)) for entry in out.split("\x01") if entry.strip()]


def test_commit_subjects_are_short_and_apart_from_the_body() -> None:
    bad = []
    for commit, message in _messages():
        lines = message.splitlines()
        if len(lines[0]) > MAX_SUBJECT or (len(lines) > 1 and lines[1].strip()):
            bad.append(f"{commit} {lines[0][:80]}")
    assert bad == []
