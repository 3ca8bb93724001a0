#!/usr/bin/env bash
# CI set-up and tear-down of the Docker backend's engine and images, on a fresh machine.
#
#   eval "$(scripts/ci_docker.sh up)"   # installs docker.io + debootstrap, starts the private
#                                       # dockerd, builds the images offline; prints the exports
#   scripts/ci_docker.sh down           # stops the daemon `up` started
#
# `up` prints only `export ...` lines on stdout (progress goes to stderr) and also writes them to
# $PTC_DOCKER_ENV_FILE (default /tmp/ptc-docker.env) for a caller that prefers `source`. The base image
# build (debootstrap, ~1 minute) is skipped when the engine's data root already holds it.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_FILE=${PTC_DOCKER_ENV_FILE:-/tmp/ptc-docker.env}

up() {
  export DEBIAN_FRONTEND=noninteractive
  local need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  # gVisor (the Docker backend's `runsc` tier); scripts/dockerd.sh registers it with the engine.
  command -v runsc >/dev/null || need+=(runsc)
  if [ ${#need[@]} -gt 0 ]; then
    echo "ci_docker: installing ${need[*]}" >&2
    apt-get update -qq >&2
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  local exports
  exports=$(scripts/dockerd.sh start)
  eval "$exports"
  # The engine's data root is kept between runs as an image cache: start the tests from no
  # sandbox containers at all, whatever an interrupted earlier run left (even `Dead` ones).
  local stale
  stale=$(/usr/bin/docker ps -aq --filter label=org.ptc-sandbox.managed)
  if [ -n "$stale" ]; then
    echo "ci_docker: removing $(echo "$stale" | wc -l) sandbox containers of earlier runs" >&2
    # shellcheck disable=SC2086
    /usr/bin/docker rm -f $stale >/dev/null
  fi
  local started
  started=$(date +%s)
  # --server: also the server's own image (top-level Dockerfile), on a local debootstrap base;
  # tests/server/test_server_image.py runs it.
  scripts/build_images.sh --server >&2
  echo "ci_docker: images ready in $(( $(date +%s) - started )) s" >&2
  local image=${PTC_DOCKER_IMAGE:-ptc-sandbox-runtime:latest}
  {
    echo "$exports"
    echo "export PTC_DOCKER_HOST=$DOCKER_HOST"
    echo "export PTC_DOCKER_IMAGE=$image"
    echo "export PTC_SERVER_IMAGE=${PTC_SERVER_IMAGE:-ptc-sandbox-server:latest}"
  } | tee "$ENV_FILE"
}

down() {
  scripts/dockerd.sh stop
  rm -f "$ENV_FILE"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
