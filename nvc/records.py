"""``NamedTuple``, the base of nvc-py's records, made at a fraction of ``typing.NamedTuple``'s cost.

A direct hook call defines some 55 records as its modules import. ``typing.NamedTuple`` turns each
field's annotation (a string, under ``from __future__ import annotations``) into a compiled
``ForwardRef`` that nothing here reads, and the ``collections.namedtuple`` under it compiles a
``__new__`` of its own for every class and makes its methods anew: together some 100-200 µs a record
(docs/performance.md). This base makes the same class: a tuple with the fields (``_tuplegetter``, the
accessor namedtuple uses), defaults, ``_fields``, ``_field_defaults``, ``_make``, ``_replace``,
``_asdict``, ``__repr__`` and ``__match_args__``, the annotations as written, and the methods and
docstring of its body. Its ``__new__`` is one code object per number of fields, compiled once and
given the fields' names; the other methods are the same functions for every record.
Type checkers see ``typing.NamedTuple`` itself.
"""

from __future__ import annotations

import sys
from types import FunctionType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any
    from typing import NamedTuple as NamedTuple
else:
    from _collections import _tuplegetter

    _NEW_GLOBALS = {"_tuple_new": tuple.__new__, "__builtins__": {}}
    _UNEXPECTED = TypeError if sys.version_info >= (3, 13) else ValueError  # namedtuple's, as 3.13 changed it
    _new_codes: dict[int, CodeType] = {}  # a record's __new__ by its number of fields, as compiled

    def _new(typename: str, fields: tuple[str, ...], defaults: tuple[Any, ...]) -> FunctionType:
        """``__new__(_cls, <fields>)``: the code compiled for that many fields, its arguments named."""
        code = _new_codes.get(len(fields))
        if code is None:
            names = "".join(f"_{index}, " for index in range(len(fields)))
            code = eval(f"lambda _cls, {names}: _tuple_new(_cls, ({names}))", _NEW_GLOBALS).__code__
            _new_codes[len(fields)] = code
        code = code.replace(co_varnames=("_cls", *fields), co_name="__new__", co_qualname=f"{typename}.__new__")
        return FunctionType(code, _NEW_GLOBALS, "__new__", defaults or None)

    def _make(cls: type, iterable: Any) -> Any:
        """Make a new record from a sequence or iterable of its fields' values."""
        result = tuple.__new__(cls, iterable)
        if len(result) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(result)}")
        return result

    def _replace(self: Any, /, **changes: Any) -> Any:
        """Return a new record with the fields named in ``changes`` replaced by their values."""
        result = self._make(map(changes.pop, self._fields, self))
        if changes:
            raise _UNEXPECTED(f"Got unexpected field names: {list(changes)!r}")
        return result

    def _repr(self: Any) -> str:
        """Return a nicely formatted representation string."""
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({shown})"

    def _asdict(self: Any) -> dict[str, Any]:
        """Return a new dict which maps field names to their values."""
        return dict(zip(self._fields, self, strict=True))

    def _getnewargs(self: Any) -> tuple[Any, ...]:
        """Return self as a plain tuple (copy and pickle)."""
        return tuple(self)

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
            fields = tuple(annotations)
            defaults: list[str] = []  # the fields given a value, which must come last
            for field in fields:
                if field.startswith("_"):
                    raise ValueError(f"Field names cannot start with an underscore: {field!r}")
                if field in ns:
                    defaults.append(field)
                elif defaults:
                    raise TypeError(
                        f"Non-default namedtuple field {field} cannot follow default field"
                        f"{'s' if len(defaults) > 1 else ''} {', '.join(defaults)}"
                    )
            values = tuple(ns[field] for field in defaults)
            shown = ", ".join(fields)
            body = {
                "__doc__": f"{typename}({shown})",
                "__slots__": (),
                "__module__": ns["__module__"],
                "__annotations__": annotations,
                "_fields": fields,
                "_field_defaults": dict(zip(defaults, values, strict=True)),
                "__match_args__": fields,
                "__new__": _new(typename, fields, values),
                "_make": classmethod(_make),
                "_replace": _replace,
                "__repr__": _repr,
                "_asdict": _asdict,
                "__getnewargs__": _getnewargs,
            }
            for index, field in enumerate(fields):
                body[field] = _tuplegetter(index, f"Alias for field number {index}")
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
                if key not in _SPECIAL and key not in annotations:
                    body[key] = value
            return type(typename, (tuple,), body)

    class NamedTuple(metaclass=_RecordMeta):
        """Subclassed as ``typing.NamedTuple``: ``class Point(NamedTuple): x: int; y: int = 0``."""
