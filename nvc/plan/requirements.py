"""Container requirements (``--require`` and ``NVIDIA_REQUIRE_*``): parse once, check per GPU.

Grammar (the reference's): space-separated terms are OR-ed, comma-separated factors within a
term are AND-ed; a factor is ``name op value`` with op in ``= != < <= > >=``. ``cuda``,
``driver`` and ``arch`` compare as versions; ``brand`` compares case-insensitively with ``=`` and
``!=`` only. Parsing rejects bad input before anything is changed.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence

from nvc.errors import InputError, RequirementError, shown
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

VERSION_PROPERTIES = frozenset({"cuda", "driver", "arch"})
PROPERTIES = VERSION_PROPERTIES | {"brand"}

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_FACTOR = re.compile(r"^([A-Za-z_]+)(!=|<=|>=|=|<|>)(.+)$")
_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})*")  # ASCII: int() takes 4300 digits at most
_DRIVER_HINT = ", please update your driver to a newer version, or use an earlier cuda container"


def version_key(text: str) -> tuple[int, ...]:
    """Numeric components with trailing zeros dropped, so ``12.4 == 12.4.0`` and ``12.10 > 12.9``."""
    if not _VERSION.fullmatch(text):
        raise InputError(f"invalid version: {shown(text)}")
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


class Factor(NamedTuple):
    """One ``name op value`` comparison."""

    name: str
    op: str
    value: str

    def holds(self, facts: Mapping[str, str | None]) -> bool:
        """True when the fact satisfies the comparison; a fact the driver cannot tell counts as satisfied."""
        actual = facts.get(self.name)
        if actual is None:
            return True
        if self.name == "brand":
            return _OPS[self.op](actual.lower(), self.value.lower())
        return _OPS[self.op](version_key(actual), version_key(self.value))


class Requirement(NamedTuple):
    """One requirement expression: OR of terms, each an AND of factors."""

    text: str
    terms: tuple[tuple[Factor, ...], ...]

    def holds(self, facts: Mapping[str, str | None]) -> bool:
        return any(all(f.holds(facts) for f in term) for term in self.terms)

    def failure(self) -> str:
        """The reference's message: the first OR term, plus a hint for a too old driver."""
        first = self.text.split()[0]
        hint = _DRIVER_HINT if first.lower().startswith("cuda>=") else ""
        return f"unsatisfied condition: {first}{hint}"


def parse_factor(text: str) -> Factor:
    match = _FACTOR.match(text)
    if not match:
        raise InputError(f"invalid requirement factor: {shown(text)}")
    name, op, value = match.group(1).lower(), match.group(2), match.group(3)
    if name not in PROPERTIES:
        raise InputError(f"unknown requirement property: {shown(name)} in {shown(text)}")
    if name == "brand":
        if op not in ("=", "!="):
            raise InputError(f"invalid operator for brand: {shown(text)}")
    else:
        version_key(value)
    return Factor(name, op, value)


def parse_requirement(text: str) -> Requirement:
    """Parse one expression; empty terms and factors are ignored, an empty expression is refused."""
    terms = tuple(tuple(parse_factor(f) for f in term.split(",") if f) for term in text.split())
    terms = tuple(t for t in terms if t)
    if not terms:
        raise InputError(f"empty requirement: {shown(text)}")
    return Requirement(text.strip(), terms)


def check(requirements: Sequence[Requirement], facts_per_gpu: Sequence[Mapping[str, str | None]]) -> None:
    """Raise :class:`RequirementError` for the first requirement some GPU does not satisfy.

    ``facts_per_gpu`` has one mapping per selected GPU (keys cuda, driver, arch, brand); with no
    GPU selected the caller passes one mapping without arch and brand, as the reference does.
    """
    for req in requirements:
        for facts in facts_per_gpu:
            if not req.holds(facts):
                raise RequirementError(req.failure())
