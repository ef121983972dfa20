"""``NamedTuple``, the base of nvc-py's records, made at half of ``typing.NamedTuple``'s cost.

A direct hook call defines some 40 records as its modules import, and ``typing.NamedTuple`` turns each
field's annotation (a string, under ``from __future__ import annotations``) into a compiled
``ForwardRef`` that nothing here reads: about 100 µs of every record, most of its cost
(docs/performance.md). This base makes the same class, a ``collections.namedtuple`` with the
annotations, defaults, methods and docstring of its body, and leaves the annotations as written.
Type checkers see ``typing.NamedTuple`` itself.
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
    from typing import NamedTuple as NamedTuple
else:
    # what a record's body may not set, and what it has that is not copied onto the class (as typing's)
    _PROHIBITED = frozenset(
        {
            "__new__",
            "__init__",
            "__slots__",
            "__getnewargs__",
            "_fields",
            "_field_defaults",
            "_make",
            "_replace",
            "_asdict",
            "_source",
        }
    )
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})

    class _RecordMeta(type):
        def __new__(mcls, typename: str, bases: tuple[type, ...], ns: dict[str, Any]) -> type:
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, typename, bases, ns)
            annotations = ns.get("__annotations__", {})
            defaults: list[str] = []  # the fields given a value, which must come last
            for field in annotations:
                if field in ns:
                    defaults.append(field)
                elif defaults:
                    raise TypeError(
                        f"Non-default namedtuple field {field} cannot follow default field"
                        f"{'s' if len(defaults) > 1 else ''} {', '.join(defaults)}"
                    )
            values = [ns[field] for field in defaults]
            record = collections.namedtuple(typename, annotations, defaults=values, module=ns["__module__"])
            record.__annotations__ = annotations
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
                if key not in _SPECIAL and key not in annotations:
                    setattr(record, key, value)
            return record

    class NamedTuple(metaclass=_RecordMeta):
        """Subclassed as ``typing.NamedTuple``: ``class Point(NamedTuple): x: int; y: int = 0``."""
