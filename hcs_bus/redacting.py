"""Secrets never reach a log line or a printed line (pure: no I/O).

* ``redact_url("nats://hcs:s3cret@bus:4222")`` → ``nats://hcs:***@bus:4222``;
  a user alone is a token in NATS (``nats://t0ken@bus``), so it goes whole:
  ``nats://***@bus``. A comma-separated server list is redacted part by part.
* ``redact_text`` does the same for any URL inside free text (an error's
  ``repr``, a traceback), and for the ``netloc='…@'`` of a ``ParseResult``.
* ``redact_event`` is a structlog processor (``hcs_bus.telemetry`` installs
  it): every string value is passed through ``redact_text`` and the value of
  a key that names a secret (``password``, ``token``, ``seed`` …) is masked.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

MASK = "***"
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/\s,'\"<>]*)@")
_NETLOC = re.compile(r"(?P<key>netloc=['\"])(?P<info>[^'\"]*)@")
_SECRET_KEYS = re.compile(r"pass(word)?|passwd|token|secret|seed|credential|authorization", re.I)


def redact_url(url: str) -> str:
    """The URL (or comma-separated URLs) with its password or token masked."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URL in it masked."""
    if "@" not in text:
        return text
    text = _URL_USERINFO.sub(lambda m: m["scheme"] + _mask_info(m["info"]) + "@", text)
    return _NETLOC.sub(lambda m: m["key"] + _mask_info(m["info"]) + "@", text)


def _mask_info(info: str) -> str:
    user, colon, _password = info.partition(":")
    if colon:
        return f"{user}:{MASK}"
    return MASK  # a user with no password is a token


def is_secret_key(key: str) -> bool:
    """Whether a field or log key names a secret (its value is never shown)."""
    return bool(_SECRET_KEYS.search(key)) and not key.endswith(("_file", "_path"))


def redact_event(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: mask secret keys and credentials in URLs."""
    for key, value in event_dict.items():
        if value is not None and value != "" and is_secret_key(key):
            event_dict[key] = MASK
        elif isinstance(value, str) and "@" in value:
            event_dict[key] = redact_text(value)
    return event_dict
