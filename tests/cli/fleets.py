"""The simulated fleet the `hcs up` tests run: an A100 node, an H100 node in the
same network group and an Ascend node in another. The demo job asks for 8 ×
A100-80G with substitution allowed, so it starts on gpu-a; when gpu-a's device 2
fails, its replacement lands on gpu-h."""

from __future__ import annotations

_HEAD = """\
report_interval_s: 1
seed: 1
nodes:
"""
_GPU_A = """\
  - name: gpu-a
    network_group: ng-a
    devices: {model: nvidia/A100-80G, count: 8}
    topology: nvlink
"""
_OTHERS = """\
  - name: gpu-h
    network_group: ng-a
    devices: {model: nvidia/H100-SXM, count: 8}
    topology: nvlink
  - name: npu-b
    network_group: ng-b
    devices: {model: huawei/Ascend910B2, count: 4}
    topology: hccs
"""


def demo_fleet(*, gpu_a_2_fails_at_s: int | None = None) -> str:
    """The fleet file's text; gpu-a's device 2 fails (Xid 79) ``gpu_a_2_fails_at_s``
    seconds in when given, never otherwise."""
    failure = ""
    if gpu_a_2_fails_at_s is not None:
        failure = "    failures:\n"
        failure += f"      - {{at_s: {gpu_a_2_fails_at_s}, device: 2, kind: xid, code: 79}}\n"
    return _HEAD + _GPU_A + failure + _OTHERS
