"""Text from outside -- a flag, an environment variable, a file, a server's answer: what is
refused, what is cleaned before it is stored, and how it is shown in a message.

Three kinds of characters never belong in a setting, an identifier or a stored message:

- a lone surrogate (``\\udcff``): Python's decoding of bytes that are not UTF-8 in ``argv``
  and ``os.environ``; it cannot be encoded again, so a database driver, a ``uuid5`` or a
  terminal raises on it;
- a control character (C0, DEL, C1): a NUL cannot be stored by PostgreSQL, CR/LF inject
  headers or log lines, ESC sequences rewrite an operator's terminal;
- a bidirectional override (U+202A-U+202E, U+2066-U+2069): it makes a value read as
  something else.

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Final

#: Bidirectional embeddings, overrides and isolates.
_BIDI: Final = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
#: ANSI escape sequences: CSI (``ESC [ ... m``), OSC (``ESC ] ... BEL``/``ESC \\``), and
#: two-character escapes; removed whole from stored text, not only their ESC.
_ANSI: Final = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])|\x9b[0-?]*[ -/]*[@-~]"
)
#: What a line break or tab in multi-line free text is allowed to be.
_LAYOUT: Final = "\n\t"


def _bad(ch: str, allow_layout: bool) -> bool:
    code = ord(ch)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return not (allow_layout and ch in _LAYOUT)
    return 0xD800 <= code <= 0xDFFF or ch in _BIDI


def bad_character(text: str, *, allow_layout: bool = False) -> str | None:
    """What is wrong with the first character of ``text`` that cannot be taken, or None.

    ``allow_layout``: newlines and tabs are fine (a multi-line reason).
    """
    for index, ch in enumerate(text):
        if not _bad(ch, allow_layout):
            continue
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            return f"is not valid UTF-8 (byte 0x{code - 0xDC00:02x} at position {index})"
        if 0xD800 <= code <= 0xDFFF:
            return f"has an unpaired surrogate U+{code:04X} at position {index}"
        if ch in _BIDI:
            return f"has a bidirectional override U+{code:04X} at position {index}"
        return f"has a control character U+{code:04X} at position {index}"
    return None


def check_plain(text: str, what: str, *, allow_layout: bool = False) -> str:
    """``text`` when :func:`bad_character` finds nothing, else ValueError naming ``what``."""
    problem = bad_character(text, allow_layout=allow_layout)
    if problem is not None:
        allowed = " (line breaks and tabs are fine)" if allow_layout else ""
        raise ValueError(
            f"{what} {problem}: write it as plain UTF-8 text without control characters{allowed}"
        )
    return text


def printable(text: str) -> str:
    """``text`` safe to print in a message: every character :func:`bad_character` refuses
    (line breaks and tabs included) written as its Python escape (``\\x1b``, ``\\udcff``)."""
    if not any(_bad(ch, False) for ch in text):
        return text
    return "".join(
        ch.encode("unicode_escape", "backslashreplace").decode("ascii") if _bad(ch, False) else ch
        for ch in text
    )


def clean_text(text: str) -> str:
    """Text from outside made fit to store and show: ANSI escape sequences removed, every
    other refused character (line breaks and tabs kept) replaced by U+FFFD."""
    stripped = _ANSI.sub("", text)
    if not any(_bad(ch, True) for ch in stripped):
        return stripped
    return "".join("\ufffd" if _bad(ch, True) else ch for ch in stripped)


def clean_json(value: Any) -> Any:
    """A JSON value (dicts, lists, strings, numbers) with :func:`clean_text` applied to every
    string in it, keys included: PostgreSQL's ``jsonb`` refuses a NUL (``\\u0000``)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value
