"""What a part's log says about why it stopped: its last lines and the reason.

``hcs up`` writes each part's stderr (JSON log lines, or a bare Python
traceback when a part dies before logging is set up) to ``logs/<part>.log``
in its state folder, which is deleted at exit unless ``--state-dir`` keeps it.
When a part exits on its own, ``hcs up`` prints these lines so the cause is
on the screen, not in a folder about to vanish.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

_ERROR_LEVELS = ("error", "critical", "exception")


def tail(path: Path, *, lines: int = 12) -> list[str]:
    """The last ``lines`` non-empty lines of ``path`` ([] when it cannot be read)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return list(deque((line.rstrip() for line in f if line.strip()), maxlen=lines))
    except OSError:
        return []


def reason(lines: list[str]) -> str | None:
    """The most telling line: a traceback's final exception, else the last
    error-level log event (with its error field), else None."""
    for line in reversed(lines):
        event = _json(line)
        if event is None:
            if _exception_line(line):
                return line.strip()
            continue
        if str(event.get("level", "")).lower() in _ERROR_LEVELS:
            detail = event.get("error") or event.get("reason") or event.get("exception")
            name = str(event.get("event", "error"))
            return f"{name}: {_first_line(detail)}" if detail else name
    return None


def readable(line: str) -> str:
    """One log line as a person reads it: ``level event key=value …`` for JSON."""
    event = _json(line)
    if event is None:
        return line
    head = f"{event.pop('level', '')} {event.pop('event', '')}".strip()
    event.pop("timestamp", None)
    rest = " ".join(f"{k}={_first_line(v)}" for k, v in event.items())
    return f"{head} {rest}".strip()


def _json(line: str) -> dict[str, object] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _exception_line(line: str) -> bool:
    head, sep, _ = line.partition(":")
    return (
        bool(sep)
        and not line.startswith(" ")
        and head.rsplit(".", 1)[-1].endswith(("Error", "Exception", "Exit", "Interrupt"))
    )


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[-1] if "\n" in text else text
