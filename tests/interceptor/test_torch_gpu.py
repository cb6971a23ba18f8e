"""The interceptor under real PyTorch on a real GPU (skipped without one).

Every scenario runs in a child Python that imports torch with the library in
``LD_PRELOAD``, a 4 GiB slice and a private accounting file, and prints one
JSON line per step. The same steps without the library are the control: a
refusal the control does not see is the library's doing. torch is never
imported in the pytest process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from .conftest import LIB, GiB, MiB

Step = dict[str, Any]
WAIT_S = 90.0
PAIRS = 1000


def missing_hardware() -> str | None:
    """Why these tests cannot run here, or None (torch is probed in a child)."""
    reason = "needs PyTorch with a CUDA device"
    if importlib.util.find_spec("torch") is None:
        return f"{reason} (torch is not installed)"
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    if probe.stdout.strip() != "True":
        return f"{reason} (torch.cuda.is_available() is not true)"
    return None


MISSING = missing_hardware()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

# Steps, one argument each: info | nvml | alloc:NAME:BYTES | free:NAME | hold | bench:PAIRS:BYTES
CHILD = r"""
import ctypes, json, sys, time
import torch

def emit(**fields):
    print(json.dumps(fields), flush=True)

def alloc(held, name, size):
    try:
        held[name] = torch.empty(int(size), dtype=torch.uint8, device="cuda:0")
    except torch.cuda.OutOfMemoryError as exc:
        emit(op="alloc", name=name, ok=False, error=type(exc).__name__)
    else:
        emit(op="alloc", name=name, ok=True)

def free(held, name):
    del held[name]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    emit(op="free", name=name)

def info():
    free_b, total_b = torch.cuda.mem_get_info(0)
    emit(op="info", free=free_b, total=total_b, backend=torch.cuda.get_allocator_backend())

def hold():
    emit(op="hold")
    sys.stdin.readline()

def nvml():
    import pynvml
    pynvml.nvmlInit()
    memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
    emit(op="nvml", total=memory.total, used=memory.used, free=memory.free)

def rounds(pair, pairs, count=5):
    for _ in range(100):
        pair()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        for _ in range(pairs):
            pair()
        times.append(time.perf_counter() - started)
    return times

def bench(pairs, size):
    pairs, size = int(pairs), int(size)
    torch.empty(1, device="cuda:0")
    torch.cuda.synchronize()
    with open("/proc/self/maps") as maps:
        paths = sorted({w for w in maps.read().split() if "/libcudart.so" in w})
    out = {"op": "bench", "device": torch.cuda.get_device_name(0), "pairs": pairs,
           "size": size, "cudart": paths[0] if paths else None, "ctypes_s": None,
           "failures": 0}
    if paths:
        rt = ctypes.CDLL(paths[0])
        malloc, release = rt.cudaMalloc, rt.cudaFree
        malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        release.argtypes = [ctypes.c_void_p]
        ptr = ctypes.c_void_p()
        ref = ctypes.byref(ptr)
        def pair():
            if malloc(ref, size) or release(ptr):
                out["failures"] += 1
        out["ctypes_s"] = rounds(pair, pairs)
    out["torch_s"] = rounds(lambda: torch.empty(size, dtype=torch.uint8, device="cuda:0"), pairs)
    emit(**out)

held = {}
for step in sys.argv[1:]:
    op, *args = step.split(":")
    if op == "alloc":
        alloc(held, *args)
    elif op == "free":
        free(held, *args)
    elif op == "info":
        info()
    elif op == "hold":
        hold()
    elif op == "nvml":
        nvml()
    elif op == "bench":
        bench(*args)
    else:
        raise SystemExit(f"unknown step {step!r}")
"""


def environment(*, shm: Path | None, **extra: str) -> dict[str, str]:
    """This process's environment without our variables; with the library
    and a 4 GiB slice on ``shm`` unless it is None."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HCS_", "PYTORCH_")) and k != "LD_PRELOAD"
    }
    if shm is not None:
        env.update(LD_PRELOAD=str(LIB), HCS_SHM_PATH=str(shm), HCS_VRAM_QUOTA="4Gi")
    env.update(extra)
    return env


class Child:
    """A child Python running ``steps``; its JSON lines arrive on a queue."""

    def __init__(self, steps: list[str], *, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.seen: list[Step] = []
        self._lines: queue.Queue[Step | None] = queue.Queue()
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", CHILD, *steps],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.startswith("{"):
                self._lines.put(json.loads(raw))
        self._lines.put(None)

    def _next(self, waiting_for: str) -> Step | None:
        try:
            return self._lines.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"no {waiting_for} from the child in {WAIT_S} s: {self.stderr()}")

    def stderr(self) -> str:
        return self.log.read_text()[-4000:]

    def until(self, op: str) -> list[Step]:
        """Every step reported so far, up to the first ``op``."""
        while (line := self._next(op)) is not None:
            self.seen.append(line)
            if line["op"] == op:
                return self.seen
        pytest.fail(f"the child ended before {op!r}: {self.stderr()}")

    def release(self) -> None:
        """Let a child waiting in ``hold`` go on."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> list[Step]:
        """Every step, once the child has exited cleanly."""
        while (line := self._next("exit")) is not None:
            self.seen.append(line)
        assert self.proc.wait(timeout=WAIT_S) == 0, self.stderr()
        return self.seen

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT_S)
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def ops(steps: list[Step], op: str) -> list[Step]:
    return [step for step in steps if step["op"] == op]


def allocation(steps: list[Step], name: str) -> Step:
    return next(step for step in ops(steps, "alloc") if step["name"] == name)


@pytest.fixture(scope="session")
def library(request: pytest.FixtureRequest) -> Path:
    """The library built by make (``built``), or as scripts/gpu-check.sh
    compiled it where make is missing."""
    if shutil.which("make") is None and LIB.exists():
        return LIB
    request.getfixturevalue("built")
    return LIB


# 2 GiB in, 3 GiB more (5 > 4), the 2 GiB out, 3 GiB again.
STEPS = ["info", f"alloc:a:{2 * GiB}", "info", f"alloc:b:{3 * GiB}", "free:a", f"alloc:c:{3 * GiB}"]


# PyTorch's three ways of taking device memory, each a road past a library
# that watched cudaMalloc alone: the caching allocator (cudaMalloc), the
# stream-ordered pool (cudaMallocAsync, reached through the driver's entry
# table) and expandable segments (cuMemCreate + cuMemMap).
ALLOCATORS = {
    "caching": ("", "native"),
    "async": ("backend:cudaMallocAsync", "cudaMallocAsync"),
    "expandable": ("expandable_segments:True", "native"),
}


@pytest.fixture(scope="module", params=list(ALLOCATORS))
def allocator(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def allocator_env(allocator: str) -> dict[str, str]:
    conf, _ = ALLOCATORS[allocator]
    return {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}


@pytest.fixture(scope="module")
def sliced(library: Path, allocator: str, tmp_path_factory: pytest.TempPathFactory) -> list[Step]:
    tmp = tmp_path_factory.mktemp(f"sliced-{allocator}")
    env = environment(shm=tmp / "vram.shm", **allocator_env(allocator))
    with Child(STEPS, env=env, log=tmp / "child.err") as child:
        return child.finish()


@pytest.fixture(scope="module")
def unsliced(allocator: str, tmp_path_factory: pytest.TempPathFactory) -> list[Step]:
    tmp = tmp_path_factory.mktemp(f"unsliced-{allocator}")
    with Child(
        STEPS, env=environment(shm=None, **allocator_env(allocator)), log=tmp / "child.err"
    ) as child:
        return child.finish()


def test_pytorch_sees_a_4gi_slice_as_the_whole_device(
    sliced: list[Step], unsliced: list[Step], allocator: str
) -> None:
    first = ops(sliced, "info")[0]
    assert first["backend"] == ops(unsliced, "info")[0]["backend"] == ALLOCATORS[allocator][1]
    assert first["total"] == 4 * GiB
    assert 0 < first["free"] <= 4 * GiB
    assert ops(unsliced, "info")[0]["total"] > 4 * GiB  # the device itself is larger


def test_two_gib_fit_in_the_slice_and_leave_at_most_two_free(sliced: list[Step]) -> None:
    assert allocation(sliced, "a")["ok"] is True
    assert ops(sliced, "info")[1]["free"] <= 2 * GiB


def test_three_more_gib_raise_out_of_memory_only_under_the_library(
    sliced: list[Step], unsliced: list[Step]
) -> None:
    assert allocation(sliced, "b") == {
        "op": "alloc",
        "name": "b",
        "ok": False,
        "error": "OutOfMemoryError",
    }
    assert allocation(unsliced, "b")["ok"] is True


def test_freeing_the_two_gib_makes_room_for_three_again(sliced: list[Step]) -> None:
    assert ops(sliced, "free") == [{"op": "free", "name": "a"}]
    assert allocation(sliced, "c")["ok"] is True


def test_two_processes_on_one_accounting_file_share_one_slice(
    library: Path, tmp_path: Path
) -> None:
    env = environment(shm=tmp_path / "vram.shm")
    holder_steps = [f"alloc:a:{3 * GiB}", "hold", "free:a"]
    other_steps = ["info", f"alloc:b:{2 * GiB}", "hold", f"alloc:c:{2 * GiB}"]
    with Child(holder_steps, env=env, log=tmp_path / "holder.err") as holder:
        assert allocation(holder.until("hold"), "a")["ok"] is True
        with Child(other_steps, env=env, log=tmp_path / "other.err") as other:
            seen = other.until("hold")
            holder.release()
            holder.finish()
            other.release()
            seen = other.finish()
    assert ops(seen, "info")[0]["free"] <= 1 * GiB
    assert allocation(seen, "b") == {
        "op": "alloc",
        "name": "b",
        "ok": False,
        "error": "OutOfMemoryError",
    }
    assert allocation(seen, "c")["ok"] is True  # once the holder let go


def smi_memory(smi: str, env: dict[str, str]) -> tuple[int, int]:
    """(total, used) MiB of GPU 0 as nvidia-smi prints them in ``env``."""
    shown = subprocess.run(
        [smi, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits", "--id=0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    total, used = (int(v) for v in shown.stdout.split(","))
    return total, used


def test_nvml_and_nvidia_smi_inside_the_slice_report_the_slice_and_what_it_holds(
    library: Path, tmp_path: Path
) -> None:
    """What monitoring inside the container sees: pynvml in the process that
    holds 2 GiB, and nvidia-smi run beside it on the same accounting file."""
    env = environment(shm=tmp_path / "vram.shm")
    smi = shutil.which("nvidia-smi")
    with Child(
        [f"alloc:a:{2 * GiB}", "nvml", "hold"], env=env, log=tmp_path / "child.err"
    ) as child:
        seen = child.until("hold")
        sliced = smi_memory(smi, env) if smi else None
        child.release()
        child.finish()
    (nvml,) = ops(seen, "nvml")
    assert nvml["total"] == 4 * GiB
    assert 2 * GiB <= nvml["used"] <= 4 * GiB and nvml["free"] == nvml["total"] - nvml["used"]
    if smi is None or sliced is None:
        pytest.skip("nvidia-smi is not on PATH: only the pynvml half ran")
    total, used = sliced
    assert total == 4 * 1024 and 2 * 1024 <= used <= 4 * 1024, sliced
    assert smi_memory(smi, environment(shm=None))[0] > 4 * 1024  # without it: the device


def per_pair_us(seconds: list[float] | None, pairs: int) -> str:
    if not seconds:
        return "n/a"
    return f"{statistics.median(seconds) / pairs * 1e6:.2f} (best {min(seconds) / pairs * 1e6:.2f})"


def test_a_thousand_cuda_malloc_free_pairs_are_timed_with_and_without_the_library(
    library: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs: dict[str, Step] = {}
    for name, shm in (("without", None), ("with", tmp_path / "vram.shm")):
        env = environment(shm=shm, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        with Child([f"bench:{PAIRS}:{MiB}"], env=env, log=tmp_path / f"{name}.err") as child:
            runs[name] = ops(child.finish(), "bench")[0]
    assert all(run["failures"] == 0 and run["torch_s"] for run in runs.values())
    lines = [
        f"interceptor bench on {runs['with']['device']}: us per pair of 1 MiB, median of 5x{PAIRS}"
    ]
    for name, run in runs.items():
        lines.append(
            f"  {name:>7} library: cudaMalloc+cudaFree via ctypes {per_pair_us(run['ctypes_s'], PAIRS)};"
            f" torch.empty+del uncached {per_pair_us(run['torch_s'], PAIRS)}"
        )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
