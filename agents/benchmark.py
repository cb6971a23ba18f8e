"""The FP16 matmul benchmark behind the measured ACU, run in a child process.

``python -m agents.benchmark INDEX [INDEX ...] [--n N] [--iterations K]``
measures each device in turn and prints one JSON line per device:
``{"index": 0, "tflops": 712.3, "backend": "cuda"}``, or one line
``{"index": null, "tflops": null, "reason": "..."}`` where PyTorch reaches no
device. The agent runs it as a child (``agents.measuring``) so that the CUDA
or NPU context and PyTorch's cache, about 0.5 GiB of every device it touched,
go with the child instead of staying in the agent for the node's lifetime.

Standard library and PyTorch only: nothing here logs, so stdout is the answer.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

SKIP_REASON = "needs PyTorch with a CUDA or NPU device"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def tflops(*, n: int, iterations: int, elapsed_s: float) -> float:
    """Dense TFLOPS of ``iterations`` n×n×n matmuls in ``elapsed_s`` seconds."""
    if n <= 0 or iterations <= 0:
        raise ValueError(f"n and iterations must be positive, got n={n} iterations={iterations}")
    if elapsed_s <= 0:
        raise ValueError(f"elapsed_s must be positive, got {elapsed_s}")
    return 2.0 * n**3 * iterations / elapsed_s / 1e12


def backend() -> tuple[Any, str] | None:
    """(torch, device type) where a device is usable, else None."""
    if importlib.util.find_spec("torch") is None:
        return None
    torch = importlib.import_module("torch")
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch, "cuda"
    if importlib.util.find_spec("torch_npu") is not None:
        importlib.import_module("torch_npu")
        if torch.npu.is_available():
            return torch, "npu"
    return None


def measure(index: int, *, n: int = 8192, iterations: int = 20) -> float | None:
    """Achieved dense FP16 TFLOPS on device ``index``, in this process (which
    then holds a context on that device until it exits)."""
    found = backend()
    if found is None:
        return None
    torch, kind = found
    device = torch.device(f"{kind}:{index}")
    a = torch.randn(n, n, dtype=torch.float16, device=device)
    b = torch.randn(n, n, dtype=torch.float16, device=device)
    sync = torch.cuda.synchronize if kind == "cuda" else torch.npu.synchronize
    for _ in range(3):
        torch.matmul(a, b)
    sync(device)
    started = time.perf_counter()
    for _ in range(iterations):
        torch.matmul(a, b)
    sync(device)
    return tflops(n=n, iterations=iterations, elapsed_s=time.perf_counter() - started)


def die_with(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` (the agent) dies: a
    benchmark left behind by a crashed agent, or one hung in the driver,
    would hold its device memory with nobody to stop it (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # it died before the prctl took hold
        sys.exit(f"agents.benchmark: the agent (pid {parent}) is gone")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.benchmark", description=__doc__)
    parser.add_argument("index", type=int, nargs="+", help="device index, as NVML counts")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--parent", type=int, help="die with this process (the agent's pid)")
    args = parser.parse_args(argv)
    if args.parent is not None:
        die_with(args.parent)
    found = backend()
    if found is None:
        print(json.dumps({"index": None, "tflops": None, "reason": SKIP_REASON}), flush=True)
        return 0
    for index in args.index:  # a line per device as it is done: a crash keeps the earlier ones
        result = measure(index, n=args.n, iterations=args.iterations)
        print(json.dumps({"index": index, "tflops": result, "backend": found[1]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
