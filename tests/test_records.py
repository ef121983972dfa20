"""nvc.records.NamedTuple makes the class typing.NamedTuple makes, but for the annotations' ForwardRefs:
the same fields, defaults, methods, docstring and tuple behaviour, the same refusals, and the class a
pickle finds again."""

from __future__ import annotations

import collections
import copy
import pickle
import typing

import pytest

from nvc import records


def _replace_refusal() -> type[Exception]:
    """What this interpreter's namedtuple raises for an unknown field given to _replace (3.13 changed it)."""
    try:
        collections.namedtuple("Pair", "a")(1)._replace(b=2)
    except (TypeError, ValueError) as err:
        return type(err)
    raise AssertionError("_replace took an unknown field")


_UNEXPECTED = _replace_refusal()


def _declare(base: type) -> type:
    class Point(base):  # type: ignore[valid-type, misc]
        """A point."""

        x: int
        y: str = "y"
        z: tuple[int, ...] = ()
        LIMIT = 3  # a class attribute, not a field

        def doubled(self) -> int:
            return 2 * self.x

        @property
        def first(self) -> int:
            return self.x

    return Point


def test_a_record_is_the_class_typing_namedtuple_makes() -> None:
    ours, theirs = _declare(records.NamedTuple), _declare(typing.NamedTuple)
    for cls in (ours, theirs):
        point = cls(2)
        assert point == (2, "y", ()) and isinstance(point, tuple)
        assert point.doubled() == 4 and point.first == 2 and cls.LIMIT == 3
        assert point._replace(y="b") == cls(2, "b") and point._asdict() == {"x": 2, "y": "y", "z": ()}
        assert cls._make([1, "a", (3,)]).z == (3,) and cls(x=1, z=(2,)) == (1, "y", (2,))
        assert repr(point) == "Point(x=2, y='y', z=())"
        assert copy.deepcopy(point) == point and type(copy.copy(point)) is cls
        with pytest.raises(TypeError, match=r"__new__\(\) missing 1 required positional argument: 'x'"):
            cls()
        with pytest.raises(TypeError, match="Expected 3 arguments, got 1"):
            cls._make([1])
        with pytest.raises(_UNEXPECTED, match=r"Got unexpected field names: \['w'\]"):
            point._replace(w=1)
        with pytest.raises(AttributeError):
            point.x = 3  # type: ignore[misc]
    assert ours._fields == theirs._fields and ours._field_defaults == theirs._field_defaults
    assert ours.__doc__ == theirs.__doc__ == "A point."
    assert (ours.__name__, ours.__module__) == (theirs.__name__, theirs.__module__)
    assert list(ours.__annotations__) == list(theirs.__annotations__) == ["x", "y", "z"]
    assert ours.__annotations__["z"] == "tuple[int, ...]"  # as written: no ForwardRef compiled
    assert ours.__match_args__ == theirs.__match_args__


class Kept(records.NamedTuple):
    """Declared at module level, so that pickle finds it by name."""

    name: str
    size: int = 0


def test_records_of_no_field_and_of_one_are_typing_namedtuples_too() -> None:
    for base in (records.NamedTuple, typing.NamedTuple):

        class Empty(base):  # type: ignore[valid-type, misc]
            pass

        class One(base):  # type: ignore[valid-type, misc]
            only: int

        assert Empty() == () and repr(Empty()) == "Empty()" and Empty._fields == ()
        assert One(1) == (1,) and One(only=2).only == 2 and repr(One(3)) == "One(only=3)"


def test_a_record_pickles_and_compares_as_a_tuple() -> None:
    kept = Kept("a", 2)
    assert pickle.loads(pickle.dumps(kept)) == kept and Kept.__qualname__ == "Kept"
    assert kept < Kept("b") and hash(kept) == hash(("a", 2))


def test_a_record_refuses_what_typing_namedtuple_refuses() -> None:
    for base in (records.NamedTuple, typing.NamedTuple):
        with pytest.raises(TypeError, match="Non-default namedtuple field y cannot follow default field x"):

            class Late(base):  # type: ignore[valid-type, misc]
                x: int = 0
                y: int

        with pytest.raises(ValueError, match="Field names cannot start with an underscore"):

            class Hidden(base):  # type: ignore[valid-type, misc]
                _x: int

        with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):

            class Overwrites(base):  # type: ignore[valid-type, misc]
                x: int

                def _replace(self) -> None:  # type: ignore[override]
                    pass
