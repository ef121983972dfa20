"""The configuration file's YAML document, read safely and cached.

The hook reads the configuration at every container start, and importing PyYAML costs more than
the rest of reading it: the document of the last text parsed is kept as JSON in root's own tmpfs
(:mod:`nvc.system.runcache`), and the text is compared whole, so an edit is seen at once. What the
document means (its keys, their checks) is :mod:`nvc.config`'s.
"""

from __future__ import annotations

from nvc.errors import InputError, cut, shown
from nvc.system.untrusted import MAX_DIGITS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CACHE_PATH = "/run/nvc-py/config-cache.json"
MAX_SIZE = 1 << 20  # bytes of configuration text: a real file is a few hundred
MAX_CACHE_SIZE = 4 * MAX_SIZE  # the text, and its document as JSON
MAX_INTEGER_TEXT = MAX_DIGITS + 3  # characters of a YAML integer: the digits, a sign and a 0x


def _cached_document(text: str) -> tuple[bool, Any]:
    """(True, document) when the cache (:mod:`nvc.system.runcache`: root's own file only) holds ``text``'s
    document; (False, None) otherwise."""
    from nvc.system import runcache

    raw = runcache.load(CACHE_PATH, MAX_CACHE_SIZE)
    if raw is None:
        return False, None
    import json

    try:
        cached = json.loads(raw)
    except (ValueError, RecursionError):
        return False, None
    if not isinstance(cached, dict) or cached.get("text") != text or "document" not in cached:
        return False, None
    return True, cached["document"]


def _store_document(text: str, document: Any) -> None:
    """Remember ``text``'s document for the next start, if JSON holds it exactly; best effort."""
    import json

    from nvc.system import runcache

    try:
        encoded = json.dumps({"text": text, "document": document})
        if json.loads(encoded)["document"] != document:
            return  # e.g. a YAML date or a tuple: parse such a file every time
    except (TypeError, ValueError):
        return
    runcache.store(CACHE_PATH, encoded.encode())


def _safe_load(text: str, path: str) -> Any:
    """``yaml.safe_load`` refusing anchors and aliases as it meets them, before any node is built,
    integers longer than :data:`MAX_INTEGER_TEXT` characters before they are converted, and a value
    its type cannot hold (a date ``2001-13-01``, ``!!int x``, ``!!bool maybe``) in one line naming it:
    PyYAML's constructors raise ValueError, KeyError and others of their own for those.

    A configuration has no use for anchors, and ten nested aliases (450 bytes) expand to a
    billion nodes for whatever walks the document (validation, the JSON cache). No setting is a
    number of more than a few digits, and int() refuses more than 4300 (a traceback) while
    taking 4000 that would overflow whatever uses them (a float of seconds).
    """
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise InputError(f"{path}: line {event.start_mark.line + 1}: YAML anchors and aliases are not accepted")
            return super().compose_node(parent, index)

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError):
                value = f"{shown(node.value, 40)} " if isinstance(node.value, str) else ""
                raise InputError(
                    f"{path}: line {node.start_mark.line + 1}: {value}is not a valid {node.tag.rpartition(':')[2]}"
                ) from None

        def construct_bounded_int(self, node: Any) -> int:
            if len(node.value) > MAX_INTEGER_TEXT:
                raise InputError(
                    f"{path}: line {node.start_mark.line + 1}: {cut(node.value, 20)}: a number of "
                    f"more than {MAX_INTEGER_TEXT} characters"
                )
            return self.construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_bounded_int)
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader


def read_yaml(text: str, path: str) -> Any:
    """The YAML document in ``text`` (read as :func:`_safe_load` reads it), any error in one line."""
    import yaml

    try:
        return _safe_load(text, path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}: not valid YAML{where}") from None
    except RecursionError:
        raise InputError(f"{path}: not valid YAML: nested too deeply") from None


def yaml_document(text: str, path: str) -> Any:
    """The YAML document in ``text``, from the cache when it holds this very text."""
    hit, document = _cached_document(text)
    if hit:
        return document
    document = read_yaml(text, path)
    _store_document(text, document)
    return document
