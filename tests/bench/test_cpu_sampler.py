"""``bench.cpu_sampler``: a module run under it is sampled on its CPU time
between SIGUSR1 and SIGUSR2, and its busiest function comes out on top."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from bench.throughput import top_functions
from tests.e2e.api import wait_for
from tests.e2e.cluster import ROOT

BUSY = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    def burn():
        total = 0
        for i in range(20_000):
            total += i * i
        return total

    def idle():
        time.sleep(0.01)  # waits: no CPU time, so no samples

    def main(flag, rounds):
        print("ready", sys.argv[1:], flush=True)
        while not Path(flag).exists():
            for _ in range(rounds):
                burn()
            idle()

    if __name__ == "__main__":
        main(sys.argv[1], int(sys.argv[2]))
    """
)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_module_run_under_it_is_sampled_on_cpu_time_between_the_two_signals(
    tmp_path: Path,
) -> None:
    (tmp_path / "busy.py").write_text(BUSY)
    out, flag = tmp_path / "stacks.txt", tmp_path / "stop"
    argv = [sys.executable, "-m", "bench.cpu_sampler", str(out), "-m", "busy", str(flag), "3"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    child = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == f"ready {[str(flag), '3']!r}"  # its own argv
        child.send_signal(signal.SIGUSR1)
        began = cpu_s(child.pid)
        wait_for(lambda: cpu_s(child.pid) - began > 0.6, what="0.6 s of CPU time", timeout_s=60)
        assert not out.exists()  # written at the stop, not before
        child.send_signal(signal.SIGUSR2)
        wait_for(out.exists, what="the stacks written", timeout_s=30)
        flag.touch()
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    lines = out.read_text().splitlines()
    counts = [int(line.rpartition(" ")[2]) for line in lines]
    assert sum(counts) >= 50  # 0.6 s at one sample per 4 ms is 150
    stacks = [line.rpartition(" ")[0].split(";") for line in lines]
    assert all(s[0].startswith("_run_module_as_main (") for s in stacks), stacks[:2]
    busiest, inclusive, own = top_functions(out)[0]
    assert busiest.startswith("burn (") and busiest.endswith(f"busy.py:{BUSY_BURN_LINE})")
    assert own > 0.8 and inclusive == own  # the loop, not the sleeping
    sleeping = sum(c for s, c in zip(stacks, counts, strict=True) if s[-1].startswith("idle ("))
    assert sleeping * 10 < sum(counts)  # it sleeps longer than it burns: wall time would say most


BUSY_BURN_LINE = BUSY.splitlines().index("def burn():") + 1
