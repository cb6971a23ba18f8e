"""The known accelerator models as a user names and reads them (``hcs models``,
``hcs convert``, ``hcs place --models``). Pure.

A model is named the way ``hcs place`` takes it: ``vendor/model`` in any case
(``NVIDIA/a100-80g``), or a name or alias a vendor tool prints (``A100 80GB``).
"""

from __future__ import annotations

from typing import Any

from hcs_bus.profiles import Profile, ProfileDB
from hcs_bus.units import format_mib


def resolve(db: ProfileDB, text: str) -> Profile:
    """The profile ``text`` names; KeyError (naming close keys) when none."""
    wanted = text.strip()
    by_key = {p.key.casefold(): p for p in db.all()}
    found = by_key.get(wanted.casefold())
    if found is not None:
        return found
    vendor, sep, name = wanted.rpartition("/")
    vendors = {p.vendor for p in db.all()}
    if sep and vendor.lower() in vendors:
        found = db.match(vendor.lower(), name)
    elif not sep:
        found = db.match(None, wanted)
    if found is not None:
        return found
    db.get(wanted)  # raises the KeyError that names the close keys
    raise KeyError(f"unknown device profile {wanted!r}")


def rows(db: ProfileDB, *, vendor: str | None = None) -> list[dict[str, Any]]:
    """One row per model: vendor, VRAM, dense FP16 TFLOPS and ACU."""
    chosen = [p for p in db.all() if vendor is None or p.vendor == vendor.lower()]
    return [
        {
            "model": p.key,
            "vendor": p.vendor,
            "name": p.name,
            "vram_mib": p.vram_mib,
            "tflops_fp16": p.tflops_fp16,
            "tflops_bf16": p.tflops_bf16,
            "acu": round(p.acu, 1),
            "interconnect": p.interconnect,
        }
        for p in sorted(chosen, key=lambda p: (p.vendor, -p.acu, p.model))
    ]


def table(found: list[dict[str, Any]]) -> str:
    """The rows as text, one model a line, under a header."""
    lines = [f"{'MODEL':<26} {'VENDOR':<10} {'VRAM':>7} {'FP16 TFLOPS':>11} {'ACU':>6}"]
    lines += [
        f"{r['model']:<26} {r['vendor']:<10} {format_mib(r['vram_mib']):>7} "
        f"{_figure(r['tflops_fp16']):>11} {r['acu']:>6.1f}"
        for r in found
    ]
    lines.append(
        f"{len(found)} models; FP16 TFLOPS dense (no sparsity); "
        "1 ACU = 1 % of an nvidia/A100-80G's dense FP16 (312 TFLOPS)"
    )
    return "\n".join(lines)


def _figure(value: float) -> str:
    """As the datasheet gives it: 312, 989.5, 362.05."""
    return f"{value:.2f}".rstrip("0").rstrip(".")
