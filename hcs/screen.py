"""The live ``hcs top`` screen, laid out with rich to fit the terminal.

``layout(summary, width=, height=)`` turns ``hcs.top.summarise``'s dict into
one renderable that never needs more than ``width`` columns or ``height``
rows: at 80×24 it shows the fleet line, the nodes (those with a problem
first, the rest summed up in one row when they do not fit), the jobs with
their last checkpoint and as many of the newest alerts as fit, each alert's
message folded rather than cut; wider and taller terminals get more columns
(health score, degraded counts) and the per-model table.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from hcs.top import acu_text, gib_text

_WIDE = 110  # from this width on, the extra node columns fit
_MIN_ALERT_ROWS = 3


def layout(summary: dict[str, Any], *, width: int, height: int) -> RenderableType:
    """Everything that fits in ``width`` × ``height``, most important first."""
    top = _fleet_line(summary["totals"])
    jobs = _jobs(summary["jobs"], width=width) if summary["jobs"] else None
    used = 1 + (_rows(jobs, width) + 1 if jobs else 0)
    alerts = _alerts(summary["alerts"], width=width, room=max(height // 3, _MIN_ALERT_ROWS))
    used += _rows(alerts, width) + 1 if alerts is not None else 0
    models = _models(summary["models"], width=width)
    room = height - used
    with_models = room - (_rows(models, width) + 1) >= len(summary["nodes"]) + 1
    if with_models:
        room -= _rows(models, width) + 1
    nodes = _nodes(summary["nodes"], width=width, room=max(room, 2))
    if alerts is not None:  # the alerts take whatever rows the rest left over
        spare = room - _rows(nodes, width)
        alerts = _alerts(summary["alerts"], width=width, room=_rows(alerts, width) + spare)
    parts: list[RenderableType] = [top, nodes]
    if with_models:
        parts += [Text(""), models]
    if jobs is not None:
        parts += [Text(""), jobs]
    if alerts is not None:
        parts += [Text(""), alerts]
    return Group(*parts)


def _rows(renderable: RenderableType, width: int) -> int:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    return len(console.render_lines(renderable, console.options.update(width=width), pad=False))


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(
        box=None,
        pad_edge=False,
        padding=(0, 1),
        show_edge=False,
        header_style="bold",
        title=title,
        title_justify="left",
        title_style="bold",
    )
    for name in columns:
        numeric = name in {"DEV", "OK", "DEG", "FAIL", "ACU", "SCORE", "UNHEALTHY", "VRAM GiB"}
        table.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    return table


def _gib(free_mib: float, total_mib: float) -> str:
    return f"{gib_text(free_mib)}/{gib_text(total_mib)}"


def _fleet_line(t: dict[str, Any]) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("HCS ", style="bold")
    line.append(
        f"nodes {t['nodes']:.0f}  devices {t['health']['text']}  "
        f"VRAM free {_gib(t['vram_free_mib'], t['vram_total_mib'])} GiB  ACU {acu_text(t['acu'])}"
    )
    return line


def _state(row: dict[str, Any]) -> str:
    return "stale" if row["stale"] else str(row["verdict"])


def _nodes(rows: list[dict[str, Any]], *, width: int, room: int) -> Table:
    wide = width >= _WIDE
    columns = ["NODE", "MODELS", "DEV", "FAIL", "VRAM GiB", "ACU", "STATE"]
    if wide:
        columns[3:3] = ["OK", "DEG"]
        columns.insert(-1, "SCORE")
    table = _table(*columns)
    troubled = sorted(rows, key=lambda r: (r["failed"] == 0 and not r["stale"], r["node"]))
    shown = troubled if len(troubled) <= room - 1 else troubled[: max(room - 2, 0)]
    for row in shown:
        cells = [row["node"], ",".join(row["models"]), str(row["devices"]), str(row["failed"])]
        if wide:
            cells[3:3] = [str(row["healthy"]), str(row["degraded"])]
        cells += [_gib(row["vram_free_mib"], row["vram_total_mib"]), acu_text(row["acu"])]
        if wide:
            cells.append(str(row["health"]))
        cells.append(_state(row))
        table.add_row(*cells, style="red" if row["failed"] or row["stale"] else None)
    hidden = troubled[len(shown) :]
    if hidden:
        table.add_row(f"… {len(hidden)} more", "", str(sum(r["devices"] for r in hidden)))
    _shrink(table, first=0, width=width)
    return table


def _models(rows: list[dict[str, Any]], *, width: int) -> Table:
    table = _table("VENDOR/MODEL", "DEV", "UNHEALTHY", "VRAM GiB", "ACU")
    for row in rows:
        table.add_row(
            row["model"],
            str(row["devices"]),
            str(row["unhealthy"]),
            _gib(row["vram_free_mib"], row["vram_total_mib"]),
            acu_text(row["acu"]),
        )
    _shrink(table, first=0, width=width)
    return table


def _jobs(rows: list[dict[str, Any]], *, width: int) -> Table:
    wide = width >= _WIDE
    table = _table("JOB", "POD", "NODE", *(["DEVICES"] if wide else []), "LAST CHECKPOINT")
    for job in rows:
        devices = [job["devices"]] if wide else []
        table.add_row(job["job"], job["pod"], job["node"], *devices, job["checkpoint"] or "-")
    _shrink(table, first=0, width=width)
    table.columns[-1].overflow = "fold"
    table.columns[-1].no_wrap = False
    return table


def _alerts(rows: list[dict[str, Any]], *, width: int, room: int) -> Table | None:
    """The newest alerts (``rows`` come newest first) that fit in ``room`` rows
    (title included); a message wraps onto more rows rather than losing its end."""
    if not rows or room < 2:
        return None
    for count in range(min(len(rows), room - 1), 0, -1):
        table = _alert_table(rows[:count], width=width, total=len(rows))
        if _rows(table, width) <= room:
            return table
    return None


def _alert_table(rows: list[dict[str, Any]], *, width: int, total: int) -> Table:
    title = f"ALERTS (hcs.health.*) newest first, {len(rows)} of {total}"
    table = _table("SEVERITY", "WHERE", "WHAT", title=title)
    table.add_column("MESSAGE", overflow="fold", ratio=1)
    table.show_header = False
    for a in rows:
        where = a["node"] + (f"/{a['device']}" if a["device"] is not None else "")
        style = {"fatal": "red", "warning": "yellow"}.get(a["severity"])
        what = str(a["verdict"] or a["kind"])
        table.add_row(a["severity"], where, what, a["message"] or "", style=style)
    table.width = width
    return table


def _shrink(table: Table, *, first: int, width: int) -> None:
    """Let the first column give way (ellipsis) when the table is too wide."""
    table.columns[first].overflow = "ellipsis"
    table.columns[first].no_wrap = True
    table.columns[first].max_width = max(width // 4, 12)
    if len(table.columns) > 1:
        table.columns[1].overflow = "ellipsis"
        table.columns[1].max_width = max(width // 4, 10)
