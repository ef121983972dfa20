"""What every Python fuzz target of tests/fuzz/ shares: atheris, with nvc-py's modules instrumented
for coverage, and the rule of what counts as a crash.

A target parses one input of untrusted bytes with the real entry points of one parser. Rejecting the
input with the error that parser documents (an :class:`nvc.errors.NvcError`, or the parser's own
error class) is a good outcome; any other exception (TypeError, KeyError, RecursionError,
UnicodeError, a ValueError of int()...) escapes, and atheris reports it as a crash and writes the
input (``-artifact_prefix``). tests/harness/fuzzing.py runs the targets (make fuzz, make test).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import atheris

# Instrumented where a target imports them inside ``instrumented()``: nvc-py's code (nvc.rpc and
# nvc.hook are part of it), and what the parsers hand their input to first. The json module's
# scanner in C is kept out, so that its own Python scanner (the same grammar) runs and its coverage
# guides the inputs into well-formed documents.
PACKAGES = ("nvc", "yaml", "json")
sys.modules["_json"] = None  # type: ignore[assignment]


def instrumented(extra: Iterable[str] = ()) -> atheris.import_hook.HookManager:
    """The context in which a target imports what it fuzzes: those modules get coverage feedback."""
    return atheris.instrument_imports(include=[*PACKAGES, *extra])


def fuzz(one: Callable[[bytes], None], accepted: tuple[type[BaseException], ...]) -> None:
    """Run ``one`` on the inputs libFuzzer makes (its options and corpus directories in sys.argv);
    an exception of ``accepted`` is the parser refusing the input, anything else a crash."""

    def test_one_input(data: bytes) -> None:
        try:
            one(data)
        except accepted:
            pass

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
