"""Kernel-level health probes for accelerator nodes.

Sources, best first: the eBPF loader (``ebpf/build/hcs-probe``), ``/dev/kmsg``
and polling of sysfs AER counters. Every source yields :class:`ProbeEvent`,
the Python face of the JSON line contract documented in ``ebpf/README.md``.
"""

from agents.probes.events import ProbeEvent, decode_line, encode_line

__all__ = ["ProbeEvent", "decode_line", "encode_line"]
