"""Run a Python module under a sampler of its CPU time.

``python -m bench.cpu_sampler OUT -m MODULE [ARG...]`` runs ``MODULE`` as
``python -m MODULE [ARG...]`` would. SIGUSR1 starts sampling (from nothing),
SIGUSR2 stops it and writes ``OUT``: collapsed stacks, one per line, the
frames outermost first joined by ``;``, a space, then the number of samples
(the format py-spy's ``--format raw`` and flame-graph tools read). A frame
is ``qualified name (file:first line)``: one name per function, wherever in
it the sample fell. ``OUT`` is written to a temporary name and renamed, so a
reader never sees half of it.

Why not py-spy: it samples on the wall clock and counts a thread as busy
whenever the kernel has it runnable. On a machine whose cores are all taken
(the benchmarks' case), a process that writes to a socket is often put
aside the moment it wakes the reader, still inside the write: py-spy then
charged a third of the HCS scheduler's samples to its two socket writes,
where its CPU time there is under a twentieth. This sampler counts CPU time
only (``ITIMER_PROF``: a SIGPROF every ``INTERVAL_S`` of the process's user
and system time), so a sample is a slice of work done.

The signal is handled in the main thread, at the next bytecode: a sample
falls on the Python frame that was running, C calls included in it (a
socket write counts where it was called). Work of other threads (a
resolver's, a file's) is charged to whatever the main thread runs then.
"""

from __future__ import annotations

import collections
import os
import runpy
import signal
import sys
from pathlib import Path
from types import CodeType, FrameType

INTERVAL_S = 0.004  # of CPU time between two samples: 250 a second of a busy core
_ROOTS = tuple(
    sorted(
        {str(Path(__file__).resolve().parents[1]) + os.sep}
        | {p.rstrip(os.sep) + os.sep for p in sys.path if p.endswith("-packages")},
        key=len,
        reverse=True,
    )
)


def frame_name(code: CodeType) -> str:
    """``qualified name (file:first line)``, the file relative to the
    repository or the packages' folder it lies in."""
    path = code.co_filename
    for root in _ROOTS:
        if path.startswith(root):
            path = path[len(root) :]
            break
    return f"{code.co_qualname} ({path}:{code.co_firstlineno})"


class Sampler:
    """Counts the main thread's stacks at each SIGPROF while on."""

    def __init__(self, out: Path, *, interval_s: float = INTERVAL_S) -> None:
        self.out, self.interval_s = out, interval_s
        self.counts: collections.Counter[tuple[CodeType, ...]] = collections.Counter()

    def install(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.siginterrupt(signal.SIGPROF, False)  # C code's system calls restart
        signal.signal(signal.SIGUSR1, lambda *_: self.start())
        signal.signal(signal.SIGUSR2, lambda *_: self.stop())

    def start(self) -> None:
        self.counts.clear()
        signal.setitimer(signal.ITIMER_PROF, self.interval_s, self.interval_s)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        self.write()

    def _sample(self, _signum: int, frame: FrameType | None) -> None:
        codes = []
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        codes.reverse()
        self.counts[tuple(codes)] += 1

    def write(self) -> None:
        names: dict[CodeType, str] = {}
        lines = []
        for codes, count in self.counts.items():
            frames = [names.get(c) or names.setdefault(c, frame_name(c)) for c in codes]
            lines.append(f"{';'.join(frames)} {count}\n")
        part = self.out.with_name(self.out.name + ".part")
        part.write_text("".join(lines))
        part.replace(self.out)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "-m":
        sys.exit("usage: python -m bench.cpu_sampler OUT -m MODULE [ARG...]")
    out, module = Path(argv[0]), argv[2]
    Sampler(out).install()
    sys.argv = [module, *argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
