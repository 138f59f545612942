"""File names between Python and lockbox (``lockbox_policy::name`` on the Rust side).

A Linux file name is bytes, not necessarily UTF-8. In Python lockbox gives every name as a
``str`` decoded like ``os.fsdecode`` does (bytes that are not UTF-8 become lone surrogates,
``"caf\\udce9.txt"``), so ``open(change.path)`` and ``os.fsencode(change.path)`` give back
the exact bytes. On the wire (JSON) a name that is valid UTF-8 is a string; any other is
``{"bytes": "<base64>"}``. :func:`quote` shows a name to a person as lockbox's CLI does.
"""

from __future__ import annotations

import base64
import os
import unicodedata
from typing import Any

__all__ = ["from_json", "quote", "to_json"]


def to_json(path: str | os.PathLike[str] | bytes) -> str | dict[str, str]:
    """The JSON form of a path: a string when its bytes are UTF-8, else
    ``{"bytes": base64}``."""
    raw = os.fsencode(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"bytes": base64.b64encode(raw).decode("ascii")}


def from_json(value: Any) -> str:
    """A path from its JSON form, as ``os.fsdecode`` of its bytes."""
    if isinstance(value, str):
        return os.fsdecode(value.encode("utf-8"))
    if isinstance(value, dict) and set(value) == {"bytes"}:
        return os.fsdecode(base64.b64decode(value["bytes"], validate=True))
    raise ValueError(f"not a path in lockbox's JSON form: {value!r}")


# Unicode controls that reorder or break lines (bidirectional embeddings, overrides and
# isolates; line and paragraph separators), besides the C0/C1 controls and DEL.
_LAYOUT = {"\u061c", "\u200e", "\u200f", "\u2028", "\u2029"} | {chr(c) for c in range(0x202A, 0x202F)} | {
    chr(c) for c in range(0x2066, 0x206A)
}
_NAMED = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
          "\f": "\\f", "\r": "\\r"}


def _acts_on_terminal(c: str) -> bool:
    return unicodedata.category(c) == "Cc" or c in _LAYOUT


def quote(name: str | os.PathLike[str] | bytes) -> str:
    """``name`` as lockbox prints it for people: as is, unless it holds a control character
    (newline, carriage return, escape...), a bidirectional or line-separator control, a
    ``"``, a ``\\`` or bytes that are not UTF-8; then in double quotes with C escapes
    (``\\n``, ``\\t``, ``\\"``, octal ``\\ooo`` for other bytes), as git quotes paths. A name
    so shown can never start a line or move the cursor."""
    raw = os.fsencode(name)
    text = raw.decode("utf-8", errors="surrogateescape")
    if not any(c in '"\\' or "\udc80" <= c <= "\udcff" or _acts_on_terminal(c) for c in text):
        return text
    out = ['"']
    for c in text:
        if c in _NAMED:
            out.append(_NAMED[c])
        elif "\udc80" <= c <= "\udcff":
            out.append(f"\\{ord(c) - 0xDC00:03o}")
        elif _acts_on_terminal(c):
            out.extend(f"\\{b:03o}" for b in c.encode("utf-8"))
        else:
            out.append(c)
    out.append('"')
    return "".join(out)
