"""Checkpoint detection (pure): which complete checkpoints a directory listing holds.

A ``Listing`` is what a scan of a checkpoint directory saw: every file's path
relative to the directory (POSIX), its size and mtime, and the text of the few
small marker files that name a checkpoint. Five layouts are recognised; a
checkpoint counts only once it is complete:

* Hugging Face Trainer — ``checkpoint-N/`` complete when ``trainer_state.json``
  is in it (the Trainer writes it last).
* DeepSpeed — the ``latest`` file names a tag directory (``global_stepN``);
  complete when that directory holds files.
* Megatron-LM — ``latest_checkpointed_iteration.txt`` holds the iteration
  (or ``release``); complete when ``iter_0000N`` (or ``release``) holds files.
* PyTorch Distributed Checkpoint — ``step-N/`` complete when ``.metadata``
  is in it (written last by the coordinator).
* PyTorch Lightning — ``last.ckpt`` (non-empty); its step is the highest
  ``step=N`` among the sibling ``*.ckpt`` files, else its mtime.

A single-file checkpoint (Lightning's ``last.ckpt``) has no marker written
after it, so it counts only once it has *settled*: the same size and mtime in
the ``previous`` scan, or an mtime at least ``settle_s`` before ``now``. Both
observations are passed in; nothing here reads a clock or the disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

MARKERS = ("latest", "latest_checkpointed_iteration.txt")

_HF = re.compile(r"^checkpoint-(\d+)$")
_DCP = re.compile(r"^step-(\d+)$")
_DIGITS = re.compile(r"(\d+)")
_LIGHTNING_STEP = re.compile(r"step=(\d+)")


@dataclass(frozen=True, slots=True)
class FileInfo:
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class Listing:
    root: str
    files: dict[str, FileInfo] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)

    def dirs_with_files(self) -> set[str]:
        out: set[str] = set()
        for path in self.files:
            parent = PurePosixPath(path).parent
            while str(parent) != ".":
                out.add(str(parent))
                parent = parent.parent
        return out


@dataclass(frozen=True, slots=True, order=True)
class Found:
    step: int
    framework: str
    uri: str
    mtime: float = 0.0


@dataclass(frozen=True, slots=True)
class Settling:
    """What decides whether a single file is still being written: the scan
    before this one, and (optionally) the time of this scan with how long a file
    must have been left alone to count as written."""

    previous: Listing | None = None
    now: float | None = None
    settle_s: float = 30.0

    def settled(self, rel: str, info: FileInfo) -> bool:
        before = self.previous.files.get(rel) if self.previous is not None else None
        if before is not None and before == info:
            return True
        return self.now is not None and self.now - info.mtime >= self.settle_s


def detect(listing: Listing, settling: Settling | None = None) -> list[Found]:
    """Every complete checkpoint in the listing, oldest step first."""
    dirs = listing.dirs_with_files()
    found = [
        *_hugging_face(listing),
        *_deepspeed(listing, dirs),
        *_megatron(listing, dirs),
        *_dcp(listing),
        *_lightning(listing, settling or Settling()),
    ]
    return sorted(found)


def newest(listing: Listing, settling: Settling | None = None) -> Found | None:
    found = detect(listing, settling)
    return max(found, key=lambda f: (f.step, f.mtime)) if found else None


def _uri(listing: Listing, rel: str) -> str:
    return str(PurePosixPath(listing.root) / rel)


def _top_dirs(listing: Listing, pattern: re.Pattern[str], marker: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for path in listing.files:
        parts = PurePosixPath(path).parts
        if len(parts) == 2 and parts[1] == marker:
            match = pattern.match(parts[0])
            if match:
                out.append((parts[0], int(match.group(1))))
    return out


def _hugging_face(listing: Listing) -> list[Found]:
    return [
        Found(step, "hf", _uri(listing, name), listing.files[f"{name}/trainer_state.json"].mtime)
        for name, step in _top_dirs(listing, _HF, "trainer_state.json")
    ]


def _dcp(listing: Listing) -> list[Found]:
    return [
        Found(step, "dcp", _uri(listing, name), listing.files[f"{name}/.metadata"].mtime)
        for name, step in _top_dirs(listing, _DCP, ".metadata")
    ]


def _deepspeed(listing: Listing, dirs: set[str]) -> list[Found]:
    tag = listing.texts.get("latest", "").strip()
    if not tag or "/" in tag or tag not in dirs:
        return []
    digits = _DIGITS.findall(tag)
    step = int(digits[-1]) if digits else 0
    return [Found(step, "deepspeed", _uri(listing, tag), listing.files["latest"].mtime)]


def _megatron(listing: Listing, dirs: set[str]) -> list[Found]:
    text = listing.texts.get("latest_checkpointed_iteration.txt", "").strip()
    if not text:
        return []
    if text == "release":
        name, step = "release", 0
    elif text.isdigit():
        step = int(text)
        name = f"iter_{step:07d}"
    else:
        return []
    if name not in dirs:
        return []
    mtime = listing.files["latest_checkpointed_iteration.txt"].mtime
    return [Found(step, "megatron", _uri(listing, name), mtime)]


def _lightning(listing: Listing, settling: Settling) -> list[Found]:
    info = listing.files.get("last.ckpt")
    if info is None or info.size == 0 or not settling.settled("last.ckpt", info):
        return []
    steps = [
        int(m.group(1))
        for path in listing.files
        if path.endswith(".ckpt") and (m := _LIGHTNING_STEP.search(path))
    ]
    step = max(steps) if steps else int(info.mtime)
    return [Found(step, "lightning", _uri(listing, "last.ckpt"), info.mtime)]
