"""A stand-in for PyTorch, for the CPU tests of the benchmark child
(``agents.benchmark`` run by ``agents.measuring.measure_in_child``): only what
the benchmark calls. ``HCS_FAKE_TORCH`` picks its behaviour: ``ok``, ``none``
(no device), ``hang`` (synchronize never returns), ``crash`` (device 1 fails as
a CUDA error would). At import it writes its pid and the CUDA variables it
was given to ``HCS_FAKE_TORCH_REPORT``, so a test can check the child is gone,
and prints a banner on stdout as some vendor libraries do.
The real thing is tested on a GPU (tests/agents/test_nvml.py)."""

import json
import os
import time

MODE = os.environ.get("HCS_FAKE_TORCH", "ok")
if os.environ.get("HCS_FAKE_TORCH_REPORT"):
    with open(os.environ["HCS_FAKE_TORCH_REPORT"], "w") as report:
        seen = {k: os.environ.get(k) for k in ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES")}
        json.dump({"pid": os.getpid(), **seen}, report)

print("[fake torch] a vendor library's banner, on stdout")  # not an answer: passed over

float16 = "float16"


class device:
    def __init__(self, spec: str) -> None:
        self.kind, index = spec.split(":")
        self.index = int(index)


class cuda:
    @staticmethod
    def is_available() -> bool:
        return MODE != "none"

    @staticmethod
    def device_count() -> int:
        return 0 if MODE == "none" else 2

    @staticmethod
    def synchronize(on: device) -> None:
        if MODE == "hang":
            time.sleep(3600)
        time.sleep(0.001)  # the matmuls take some time: elapsed is never 0


def randn(*shape: int, dtype: str, device: device) -> device:
    if MODE == "crash" and device.index == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return device


def matmul(a: device, b: device) -> device:
    return a
