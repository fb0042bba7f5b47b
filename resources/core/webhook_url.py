"""Webhook URLs: which are taken, where one posts (user info becomes HTTP Basic
authentication), how one is shown (scheme and host only) and how its secret parts are kept
out of every message and stored error.

An incoming-webhook URL is a credential: Slack and most others put the token in the path or
the query, some receivers take ``https://user:password@host/...``. So a URL is checked
when it is read (no space, control character or non-ASCII character could reach the HTTP
request line, where one once carried the path into an error text), shown as
``scheme://host:port/***``, and every error about a delivery passes
:func:`scrub_webhook_text` before it is stored or printed. Pure: no I/O.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from resources.core.text import bad_character, clean_text, printable


def mask_webhook_url(url: str) -> str:
    """A webhook URL safe to print: scheme and host only; its path and query (where
    incoming-webhook tokens live) and any user info become ``***``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable webhook URL>"
    if not parts.scheme or not host:
        return "<unparseable webhook URL>"
    secret = parts.path not in ("", "/") or parts.query or parts.fragment
    return printable(f"{parts.scheme}://{host}{port}/{'***' if secret else ''}")


@dataclass(frozen=True)
class WebhookTarget:
    """Where a webhook URL posts: the URL without its user info, and the HTTP Basic
    credentials that user info held (``https://user:pw@host/...``), if any."""

    endpoint: str
    authorization: str | None  # the Authorization header's value


def parse_webhook_url(url: str) -> WebhookTarget:
    """Check a webhook URL; ValueError saying what is wrong (never a secret part of it).

    Taken: ``http://`` or ``https://``, a host, an optional port from 1 to 65535, ASCII
    without spaces or control characters (a path is percent-encoded, an internationalised
    host is written in its ``xn--`` form). User info (``https://user:pw@host/...``) is sent
    as HTTP Basic authentication, percent-decoded, never as part of the host.
    """
    for index, ch in enumerate(url):
        if ch.isspace() or bad_character(ch) is not None:
            what = "a space" if ch == " " else f"a control or space character U+{ord(ch):04X}"
            if 0xD800 <= ord(ch) <= 0xDFFF:
                what = "a byte that is not UTF-8"
            raise ValueError(f"has {what} at position {index}; percent-encode it (a space is %20)")
        if not ch.isascii():
            raise ValueError(
                f"has a non-ASCII character at position {index}; percent-encode the path "
                f"(e.g. %C3%A9) and write an internationalised host name in its xn-- form"
            )
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        if "IPv6" in str(exc):
            raise ValueError(
                "has a host that is not a valid name or IP address (an IPv6 address is "
                "written in brackets: http://[::1]:8080/...)"
            ) from None
        raise ValueError("has a port that is not a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("is not an http:// or https:// URL with a host")
    if port == 0:
        raise ValueError("has a port that is not a number from 1 to 65535")
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return WebhookTarget(url, None)
    if not userinfo:
        raise ValueError("has an '@' with no user name or password before it")
    user, _, password = userinfo.partition(":")
    credentials = f"{unquote(user)}:{unquote(password)}"
    if bad_character(credentials) is not None:
        raise ValueError("has user info that percent-decodes to a control character")
    token = base64.b64encode(credentials.encode("utf-8")).decode("ascii")
    endpoint = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return WebhookTarget(endpoint, f"Basic {token}")


def _webhook_secrets(url: str) -> list[str]:
    """The parts of a webhook URL no message may hold: the URL itself, its user info, path
    and query (as given and percent-decoded), and each longer path segment or query value
    on its own (a server's error page may echo a token alone)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    userinfo = parts.netloc.rpartition("@")[0]
    whole = [url, userinfo, userinfo.partition(":")[2]]
    if parts.path not in ("", "/"):
        whole.append(parts.path)
    whole += [parts.query, parts.fragment]
    pieces = [*parts.path.split("/"), *parts.query.replace("&", "=").split("=")]
    whole += [piece for piece in pieces if len(piece) >= 8]
    found = {text for item in whole if item for text in (item, unquote(item)) if len(text) > 1}
    return sorted(found, key=len, reverse=True)


def scrub_webhook_text(text: str, url: str) -> str:
    """``text`` (an error about a delivery to ``url``) with every secret part of ``url``
    replaced by ``***`` and made fit to store (:func:`clean_text`: no ANSI escapes or
    control characters)."""
    for secret in _webhook_secrets(url):
        text = text.replace(secret, "***")
    return clean_text(text)
