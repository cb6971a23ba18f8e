# syntax=docker/dockerfile:1.7
# One image per part, from one common Python base:
#   docker build --target agent     -t ghcr.io/hcs-project/hcs-agent:0.1.0 .
#   docker build --target scheduler -t ghcr.io/hcs-project/hcs-scheduler:0.1.0 .
#   docker build --target injector  -t ghcr.io/hcs-project/hcs-injector:0.1.0 .
#   docker build --target healer    -t ghcr.io/hcs-project/hcs-healer:0.1.0 .
# The scheduler image also runs the ComputeNode mirror (python -m scheduler.report.computenode_loop)
# and the NATS auth renderer (python -m hcs_bus.permissions render).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG DEBIAN_IMAGE=debian:bookworm-slim

# -- native code: the interceptor (LD_PRELOAD) and the eBPF kernel probes ------
FROM ${DEBIAN_IMAGE} AS c-build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      make gcc libc6-dev clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev pkg-config python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY interceptor_c/ interceptor_c/
COPY ebpf/ ebpf/
COPY agents/probes/xid_severity.json agents/probes/xid_severity.json
# vmlinux.h is generated from the build host's BTF (docs/architecture.md#testing); pass another
# BTF file with --build-arg VMLINUX=... when the builder's kernel has none.
ARG VMLINUX=/sys/kernel/btf/vmlinux
RUN rm -rf interceptor_c/build ebpf/build \
 && make -C interceptor_c build/libhcs_interceptor.so \
 && make -C ebpf VMLINUX=${VMLINUX}

# -- Python: dependencies and the hcs package in a virtual environment ---------
FROM ${PYTHON_IMAGE} AS python-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hcs_bus/ hcs_bus/
COPY agents/ agents/
COPY scheduler/ scheduler/
COPY injector/ injector/
COPY healer/ healer/
COPY hcs/ hcs/
# nats-py[nkeys] (a project dependency) brings nkey authentication: deploy/ has one nkey user per part and per node
RUN pip install .

FROM ${PYTHON_IMAGE} AS python-base
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=python-build /opt/venv /opt/venv
RUN groupadd --gid 10001 hcs && useradd --uid 10001 --gid hcs --no-create-home --shell /usr/sbin/nologin hcs
WORKDIR /opt/hcs

# -- the parts ----------------------------------------------------------------
FROM python-base AS scheduler
USER 10001:10001
EXPOSE 8888
ENTRYPOINT ["python", "-m", "scheduler"]

FROM python-base AS injector
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["python", "-m", "injector"]

FROM python-base AS healer
USER 10001:10001
ENTRYPOINT ["python", "-m", "healer"]

# The agent runs as root: NVML, vendor tools, /dev/kmsg and the eBPF loader
# need it (capabilities are granted per container in deploy/base/agent).
FROM python-base AS agent
RUN apt-get update \
 && apt-get install -y --no-install-recommends libbpf1 libelf1 zlib1g pciutils kmod \
 && rm -rf /var/lib/apt/lists/*
COPY --from=c-build /src/interceptor_c/build/libhcs_interceptor.so /opt/hcs/lib/libhcs_interceptor.so
COPY --from=c-build /src/ebpf/build/hcs-probe /opt/hcs/bin/hcs-probe
ENV HCS_PROBE_BIN=/opt/hcs/bin/hcs-probe
USER 0:0
ENTRYPOINT ["python", "-m", "agents"]
