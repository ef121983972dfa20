"""nvc.records.NamedTuple makes the class typing.NamedTuple makes, but for the annotations' ForwardRefs:
the same fields, defaults, methods, docstring and tuple behaviour, the same refusals, and the class a
pickle finds again."""

from __future__ import annotations

import pickle
import typing

import pytest

from nvc import records


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
        assert cls._make([1, "a", (3,)]).z == (3,)
        assert repr(point) == "Point(x=2, y='y', z=())"
        with pytest.raises(TypeError):
            cls()
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

        with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):

            class Overwrites(base):  # type: ignore[valid-type, misc]
                x: int

                def _replace(self) -> None:  # type: ignore[override]
                    pass
