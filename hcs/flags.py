"""What a flag's value means, checked as the user typed it. Pure.

Each function is an argparse ``type=``: it returns the value in our unit or
raises ``argparse.ArgumentTypeError`` with a message that quotes the value;
argparse puts the flag's name in front (``argument --vram: …``), and the CLI
prints that one line and exits 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from decimal import Decimal

from hcs_bus.redacting import redact_text
from hcs_bus.units import QuantityError, bytes_to_mib, parse_quantity

MAX_VRAM_MIB = 1 << 30  # 1 PiB: more than any request can mean
MAX_DEVICES = 4096
MAX_REPLICAS = 5  # JetStream's own limit
_MEMORY_SUFFIXES = ("k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi")
_DNS_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$", re.IGNORECASE)
_SUBJECT_TOKEN = re.compile(r"^[^\s.*>]+$")
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SECONDS_PER = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
MAX_DURATION_S = 366 * 86400.0


def _bad(value: str, why: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{redact_text(value)!r} {why}")


def positive_number(text: str) -> float:
    """A finite number above zero (TFLOPS, ACU, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise _bad(text, "is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise _bad(text, "must be a finite number above 0")
    return value


def duration_s(text: str) -> float:
    """A span of time with its unit, in seconds: ``90s``, ``30m``, ``24h``,
    ``7d``, ``1w``, or several (``1h30m``); above 0, at most a year."""
    stripped = text.strip()
    if not _DURATION.match(stripped):
        raise _bad(text, "is not a duration; write it with a unit, e.g. 30m, 24h, 7d or 1h30m")
    seconds = sum(float(n) * _SECONDS_PER[u] for n, u in _DURATION_PART.findall(stripped))
    if not 0 < seconds <= MAX_DURATION_S:
        raise _bad(text, "must be above 0 and at most a year (366d)")
    return seconds


def device_count(text: str) -> int:
    """A whole number of devices, 1..MAX_DEVICES."""
    try:
        value = int(text)
    except ValueError:
        raise _bad(text, "is not a whole number of devices") from None
    if not 1 <= value <= MAX_DEVICES:
        raise _bad(text, f"must be 1..{MAX_DEVICES} devices")
    return value


def positive_int(text: str) -> int:
    """A whole number above zero (a message count)."""
    try:
        value = int(text)
    except ValueError:
        raise _bad(text, "is not a whole number") from None
    if value < 1:
        raise _bad(text, "must be 1 or more")
    return value


def replicas(text: str) -> int:
    """JetStream replicas: 1 on one server, 3 (or 5) in a cluster."""
    try:
        value = int(text)
    except ValueError:
        raise _bad(text, "is not a whole number of replicas") from None
    if not 1 <= value <= MAX_REPLICAS:
        raise _bad(text, f"must be 1..{MAX_REPLICAS} (JetStream keeps at most 5 copies)")
    return value


def vram_mib(text: str) -> int:
    """A memory size with its unit (``16Gi``, ``16384Mi``, ``80G``), in MiB.

    A bare number is refused: Kubernetes reads it as bytes, a person usually
    means GiB, so it is ambiguous."""
    stripped = text.strip()
    try:
        amount = parse_quantity(stripped)
    except QuantityError:
        raise _bad(
            text, "is not a memory size; write it with a unit, e.g. 16Gi or 16384Mi"
        ) from None
    if not amount.is_finite() or amount <= 0:
        raise _bad(text, "must be above 0")
    if stripped.endswith("m"):
        raise _bad(text, "is in thousandths of a byte (m); write Mi for MiB or Gi for GiB")
    if not stripped.endswith(_MEMORY_SUFFIXES):
        raise _bad(
            text, f"has no unit, so it is ambiguous: write {_guess(stripped)} (GiB) or Mi for MiB"
        )
    mib = bytes_to_mib(amount)
    if mib > MAX_VRAM_MIB:
        raise _bad(text, "is more memory than any device pool holds (at most 1Pi)")
    return mib


def _guess(text: str) -> str:
    try:
        number = Decimal(text)
    except ArithmeticError:
        return "16Gi"
    return f"{number.normalize():f}Gi" if number.is_finite() and number > 0 else "16Gi"


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` with a port 1..65535 (IPv6 in brackets: ``[::1]:8443``)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise _bad(text, "is not HOST:PORT (e.g. 127.0.0.1:8443)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _bad(text, "has no port 1..65535 (e.g. 127.0.0.1:8443)")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare != host:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            raise _bad(text, "has brackets around something that is not an IPv6 address") from None
    elif not _is_ip(host) and not _is_dns_name(host):
        raise _bad(text, "does not start with a host name or an IP address")
    return bare, int(port)


def ip_address(text: str) -> str:
    """An IPv4 or IPv6 address (a certificate's IP name)."""
    if not _is_ip(text):
        raise _bad(text, "is not an IPv4 or IPv6 address")
    return str(ipaddress.ip_address(text))


def dns_name(text: str) -> str:
    """A DNS name (a certificate's DNS name); ``*.`` first is allowed."""
    bare = text[2:] if text.startswith("*.") else text
    if not _is_dns_name(bare):
        raise _bad(text, "is not a DNS name (letters, digits and hyphens between dots)")
    return text


def subject(text: str) -> str:
    """A NATS subject to subscribe to: dot-separated tokens, ``*`` a token,
    ``>`` the last token."""
    tokens = text.split(".")
    for i, token in enumerate(tokens):
        if token == "*" or (token == ">" and i == len(tokens) - 1):
            continue
        if not _SUBJECT_TOKEN.match(token):
            raise _bad(text, "is not a NATS subject (e.g. 'hcs.health.*' or 'hcs.>')")
    return text


def nats_url(text: str) -> str:
    """One NATS URL or several, comma-separated: ``nats://host:4222``,
    ``tls://…``, ``ws://…``, or a bare ``host[:port]``."""
    urls = [u.strip() for u in text.split(",")]
    if not all(urls):
        raise _bad(text, "is not a NATS URL (e.g. nats://127.0.0.1:4222)")
    for url in urls:
        scheme, sep, rest = url.rpartition("://")
        if sep and scheme not in ("nats", "tls", "ws", "wss"):
            raise _bad(text, f"has scheme {scheme!r}; NATS speaks nats://, tls://, ws://, wss://")
        hostport = rest.rpartition("@")[2].split("/")[0]
        port = hostport.rpartition(":")[2] if ":" in hostport.lstrip("[").split("]")[-1] else ""
        if not hostport or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
            raise _bad(text, "is not a NATS URL (e.g. nats://127.0.0.1:4222)")
    return text


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list; blanks between commas dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_dns_name(text: str) -> bool:
    labels = text.rstrip(".").split(".")
    return len(text) <= 253 and all(_DNS_LABEL.match(label) for label in labels)
