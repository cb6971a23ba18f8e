#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, on a machine with PyTorch and no network:
# NVML readings, the measured ACU, and the VRAM interceptor under real PyTorch
# (tests/interceptor/test_torch_gpu.py). Results go to $OUT: pytest.txt,
# figures.txt, nvidia-smi.txt, nvml-readings.json, install.txt, build.txt.
#
# The Python packages such a machine lacks come from .gpu-wheels/ (CPython
# 3.12, manylinux x86_64), fetched beforehand on a machine with an index:
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .gpu-wheels ...
# They go into a folder of their own on PYTHONPATH (beside PyTorch's
# environment); the project itself is used from the source tree. The agent's
# test publishes on a real bus: a nats-server binary in .gpu-bin/ (copied from
# this machine, e.g. `cp "$(command -v nats-server)" .gpu-bin/`) goes on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hcs-gpu-check}
WHEELS=${HCS_GPU_WHEELS:-.gpu-wheels}
SITE=${HCS_GPU_SITE:-/tmp/hcs-gpu-site}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
mkdir -p "$OUT"
[ -x .gpu-bin/nats-server ] && export PATH=$PWD/.gpu-bin:$PATH

step() { printf '\n== %s\n' "$*"; }

# Wheels to install: all of them, except packages PyTorch images already have
# at a version new enough for the others (those listed with their minimum).
select_wheels() {
  "$PY" - "$WHEELS" <<'EOF'
import re
import sys
from importlib import metadata
from pathlib import Path

FLOORS = {
    "pytest": "8.4", "pluggy": "1.6", "iniconfig": "2", "packaging": "24",
    "pygments": "2.15", "protobuf": "6.33.5", "typing-extensions": "4.12",
    "cffi": "2.0", "pycparser": "0", "sortedcontainers": "0", "tzdata": "0",
}

def numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:4])

for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if name not in FLOORS or have is None or numbers(have) < numbers(FLOORS[name]):
        print(wheel)
EOF
}

install_wheels() {
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps --target "$SITE" "$@"
}

step "python packages"
{
  # python3 there is itself a venv (PyTorch's): a venv made from it would not
  # see torch, so the wheels go into a folder of their own, after the project
  # on PYTHONPATH
  PY=$(command -v python3)
  mkdir -p "$SITE"
  mapfile -t wanted < <(select_wheels)
  echo "installing ${#wanted[@]} wheels: ${wanted[*]##*/}"
  [ ${#wanted[@]} -eq 0 ] || install_wheels "${wanted[@]}"
  export PYTHONPATH=$PWD:$SITE
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  "$PY" -c 'import tests.conftest, agents.measuring, agents.nvml; print("project imports: ok")'
} 2>&1 | tee "$OUT/install.txt"
PY=$(command -v python3)
export PYTHONPATH=$PWD:$SITE

step "nvidia-smi"
{
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,memory.used,compute_cap \
    --format=csv || true
  nvidia-smi || true
  nvidia-smi -q || true
} 2>&1 | tee "$OUT/nvidia-smi.txt"

build_interceptor() {
  if command -v make >/dev/null; then
    make -C interceptor_c -j"$(nproc)" \
      || make -C interceptor_c -j"$(nproc)" OPT="-O2 -Wno-error"  # a newer gcc's new warnings
  else  # the library alone (tests/interceptor/test_torch_gpu.py takes it as built)
    mkdir -p interceptor_c/build \
      && gcc -std=c11 -D_GNU_SOURCE -Wall -Wextra -fPIC -mcx16 -O2 -fvisibility=hidden -shared \
        -Wl,-Bsymbolic -Wl,-soname,libhcs_interceptor.so -o interceptor_c/build/libhcs_interceptor.so \
        interceptor_c/src/*.c -ldl -lpthread
  fi
}

step "nvml readings (kept as a fixture: tests/agents/fixtures/nvml-readings-*.json)"
"$PY" -c 'import json, sys; from agents import nvml; json.dump(nvml.read_all(), sys.stdout, indent=1)' \
  >"$OUT/nvml-readings.json" 2>&1 || tail -5 "$OUT/nvml-readings.json"
wc -c "$OUT/nvml-readings.json"

step "build interceptor_c"
if ! build_interceptor >"$OUT/build.txt" 2>&1; then
  tail -40 "$OUT/build.txt"
  exit 1
fi
ls -l interceptor_c/build/libhcs_interceptor.so

step "pytest"
rc=0
timeout 240 "$PY" -m pytest -rs -v -p no:cacheprovider -p no:xdist -p no:hypothesispytest \
  -W error::pytest.PytestUnhandledThreadExceptionWarning \
  tests/agents/test_nvml.py tests/agents/test_measuring.py tests/interceptor/test_torch_gpu.py \
  2>&1 | tee "$OUT/pytest.txt" || rc=$?

step "figures"
{
  timeout 120 "$PY" - <<'EOF' || echo "measuring failed: $?"
import statistics

import torch

from agents import benchmark, measuring, nvml
from agents.parsing import nvml_readings
from hcs_bus import profiles

db = profiles.load()
name = torch.cuda.get_device_name(0)
device = nvml_readings.convert(nvml.read_all(), db=db).devices[0]
bench = measuring.bench_of(db, device)
runs = {"benchmark.measure() as the agent runs it (x20)": 20, "sustained (x200)": 200}
medians = {}
for label, iterations in runs.items():
    samples = [benchmark.measure(0, iterations=iterations) or 0.0 for _ in range(10)]
    medians[iterations] = statistics.median(samples)
    print(f"{name}: FP16 8192^3 matmul, {label}, 10 runs: "
          + ", ".join(f"{s:.0f}" for s in samples)
          + f" TFLOPS; median {medians[iterations]:.1f}, min {min(samples):.1f}, max {max(samples):.1f}")
scaled = measuring.with_measured(device, medians[20], bench_tflops=bench)
print(f"profile of {device.model}: peak {device.compute.tflops_fp16_profile} TFLOPS = "
      f"{device.compute.acu_profile} ACU; benchmark figure {bench} TFLOPS; "
      f"measured ACU {scaled.compute.acu_measured} (as a share of the A100's peak it would be "
      f"{measuring.acu_of(medians[20]):.1f})")
EOF
  # what a tenant holds outside its slice, and what no tenant can have: the
  # figures a slice's true cost needs (the ledger counts neither yet)
  timeout 60 "$PY" - <<'EOF' || echo "context size: failed $?"
import os

import pynvml
import torch

torch.zeros(1, device="cuda:0")
torch.cuda.synchronize()
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        if p.pid == os.getpid() and p.usedGpuMemory is not None]
memory = pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
print(f"a PyTorch process holding one small tensor: {[m // 2**20 for m in mine]} MiB on GPU 0 "
      f"(its CUDA context and PyTorch's first block); the driver and firmware hold "
      f"{memory.reserved // 2**20} MiB of {memory.total // 2**20} (nvmlMemory_v2.reserved)")
EOF
  grep -A2 '^interceptor bench' "$OUT/pytest.txt" || echo "interceptor bench: not in pytest.txt"
} 2>&1 | tee "$OUT/figures.txt"

step "done: pytest exit status $rc; results in $OUT"
exit "$rc"
