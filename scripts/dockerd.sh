#!/usr/bin/env bash
# Starts or stops a private Docker engine for PTC Sandbox's container backend, its tests and CI.
#
#   scripts/dockerd.sh start   # prints the export line for DOCKER_HOST; idempotent
#   scripts/dockerd.sh stop    # stops only the daemon this script started (by its pid file)
#   scripts/dockerd.sh status  # exit 0 when the engine answers
#
# The engine listens on its own unix socket with its own data root, so it never touches a
# system-wide dockerd. No bridge and no iptables rules: sandboxes run with `--network none` and
# image builds use `--network none` too, so the engine needs no networking of its own.
# Overridable: PTC_DOCKERD_SOCK, PTC_DOCKERD_ROOT, PTC_DOCKERD_EXEC_ROOT, PTC_DOCKERD_PIDFILE,
# PTC_DOCKERD_LOG, PTC_DOCKERD_CONFIG.
#
# When gVisor's `runsc` is installed (Debian package runsc), the engine's config registers it as
# the OCI runtime `runsc` for the Docker backend's gVisor tier: ptrace platform (KVM needs
# /dev/kvm access and systrap a newer runsc), gVisor's own network off (sandboxes have none),
# the OCI seccomp profile (ours) enforced inside gVisor too (`--oci-seccomp`), and host unix
# sockets open-able, which the guest needs to reach its channel sockets in its
# read-only channel directory (nothing else of the host is mounted into a container).
set -euo pipefail

SOCK=${PTC_DOCKERD_SOCK:-/run/ptc-docker.sock}
ROOT=${PTC_DOCKERD_ROOT:-/var/lib/ptc-docker}
EXEC_ROOT=${PTC_DOCKERD_EXEC_ROOT:-/run/ptc-docker-exec}
PIDFILE=${PTC_DOCKERD_PIDFILE:-/run/ptc-dockerd.pid}
LOG=${PTC_DOCKERD_LOG:-/var/log/ptc-dockerd.log}
CONFIG=${PTC_DOCKERD_CONFIG:-/etc/ptc-docker/daemon.json}
HOST="unix://$SOCK"

write_config() {
  mkdir -p "$(dirname "$CONFIG")"
  if command -v runsc >/dev/null; then
    cat >"$CONFIG" <<JSON
{
  "runtimes": {
    "runsc": {
      "path": "$(command -v runsc)",
      "runtimeArgs": ["--platform=ptrace", "--network=none", "--host-uds=open", "--oci-seccomp"]
    }
  }
}
JSON
  else
    echo '{}' >"$CONFIG"
  fi
}

answers() {
  DOCKER_HOST="$HOST" timeout 5 /usr/bin/docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

running_pid() {
  [ -f "$PIDFILE" ] || return 1
  local pid
  pid=$(cat "$PIDFILE")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
  if running_pid >/dev/null && answers; then
    echo "export DOCKER_HOST=$HOST"
    return 0
  fi
  command -v dockerd >/dev/null || { echo "dockerd not installed (apt-get install docker.io)" >&2; exit 1; }
  mkdir -p "$ROOT" "$EXEC_ROOT" "$(dirname "$LOG")"
  write_config
  # containerd is started by dockerd itself (managed mode) under the exec root.
  setsid dockerd \
    --host "$HOST" \
    --data-root "$ROOT" \
    --exec-root "$EXEC_ROOT" \
    --pidfile "$PIDFILE" \
    --config-file "$CONFIG" \
    --iptables=false --ip6tables=false --ip-masq=false --bridge=none \
    --storage-driver overlay2 \
    --log-level warn \
    </dev/null >"$LOG" 2>&1 &
  for _ in $(seq 1 150); do
    if answers; then
      echo "export DOCKER_HOST=$HOST"
      return 0
    fi
    sleep 0.2
  done
  echo "dockerd did not answer on $SOCK within 30 s; its log ($LOG):" >&2
  tail -n 30 "$LOG" >&2 || true
  exit 1
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$PIDFILE"
    return 0
  fi
  kill -TERM "$pid"
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$SOCK"; return 0; }
    sleep 0.2
  done
  echo "dockerd ($pid) did not stop within 30 s; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
