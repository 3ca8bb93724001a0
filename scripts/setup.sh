#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian/Ubuntu machine: system packages, the virtualenv, the
# package itself. `--dev` adds what the tests, lint and benchmarks need.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[ "${1:-}" = "--dev" ] && dev=1

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
# As root the host starts bwrap as the sandbox user through setpriv (sandbox/backends/process/bwrap.py).
command -v setpriv >/dev/null || need+=(util-linux)
# The process backend's syscall filter is compiled with libseccomp (loaded by pyseccomp).
/sbin/ldconfig -p | grep -q 'libseccomp\.so\.2 ' || need+=(libseccomp2)
[ -x /usr/bin/python3 ] || need+=(python3)
# The zygote's fork loop in C (sandbox/guest/forkloop.c) is built when the package installs.
command -v cc >/dev/null || need+=(gcc libc6-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# The metrics tests run their own Prometheus (tests/telemetry/test_prometheus.py).
[ $dev -eq 1 ] && ! command -v prometheus >/dev/null && need+=(prometheus)
# The fleet tests put nginx (deploy/nginx/ptc.conf) in front of their servers (tests/fleet/).
[ $dev -eq 1 ] && [ ! -x /usr/sbin/nginx ] && need+=(nginx-light)
# The TypeScript SDK (clients/typescript) is built, linted and tested with Node and npm.
[ $dev -eq 1 ] && ! command -v node >/dev/null && need+=(nodejs)
[ $dev -eq 1 ] && ! command -v npm >/dev/null && need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Debian's package enables a system Prometheus on :9090; the tests start their own instead.
# Debian's nginx package starts a system nginx on :80 likewise; the tests run their own.
if [ $dev -eq 1 ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  $SUDO systemctl disable --now nginx >/dev/null 2>&1 || true
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Installed again when pyproject.toml, setup.py or the C they build changes.
stamp=.venv/.ptc-installed-$dev-$(cat pyproject.toml setup.py sandbox/guest/forkloop.c | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if [ $dev -eq 1 ]; then
    .venv/bin/python -m pip install -q -e '.[dev]'
    # BFCL's data files only; its own dependencies pull in torch.
    .venv/bin/python -m pip install -q --no-deps bfcl-eval==2026.3.23
  else
    .venv/bin/python -m pip install -q -e .
  fi
  touch "$stamp"
fi

if [ $dev -eq 1 ]; then
  # The TypeScript package states its minimum in package.json (engines.node); older is refused
  # here with the version found rather than failing later in a build or a test.
  node_major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$node_major" -lt 20 ]; then
    echo "setup: clients/typescript needs Node >= 20, found $(node --version) at $(command -v node);" \
      "install a newer nodejs (e.g. from NodeSource) and run this again" >&2
    exit 1
  fi
  # Installed again when the lockfile changes, like the venv above.
  ts=clients/typescript
  ts_stamp=$ts/node_modules/.ptc-installed-$(cat $ts/package-lock.json | sha256sum | cut -c1-16)
  if [ ! -f "$ts_stamp" ]; then
    (cd $ts && npm ci --no-audit --no-fund --loglevel=error)
    touch "$ts_stamp"
  fi
fi
