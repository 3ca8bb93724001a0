#!/usr/bin/env bash
# Builds the sandbox runtime image for the Docker backend, offline.
#
#   scripts/build_images.sh                         # debootstrap base (cached) + runtime image
#   BASE_IMAGE=python:3.12-slim scripts/build_images.sh   # with a registry: skip debootstrap
#   scripts/build_images.sh --server                # also the server's image (top-level
#                                                   # Dockerfile), from a wheelhouse built here
#
# Without BASE_IMAGE, a minimal Debian root filesystem (`debootstrap --variant=minbase` with
# python3) is built from the Debian mirror apt already uses and imported with `docker import` as
# $PTC_BASE_IMAGE (default ptc-debootstrap-base:bookworm); it is reused when present (delete it or
# set PTC_REBUILD_BASE=1 to rebuild). Then images/Dockerfile is built on it with no network as
# $PTC_DOCKER_IMAGE (default ptc-sandbox-runtime:latest), the tag the backend uses by default.
# The engine is the one DOCKER_HOST names (scripts/dockerd.sh start prints it).
# Needs: docker (CLI), and for the debootstrap base: root, debootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME_IMAGE=${PTC_DOCKER_IMAGE:-ptc-sandbox-runtime:latest}
DEBOOTSTRAP_IMAGE=${PTC_BASE_IMAGE:-ptc-debootstrap-base:bookworm}
SERVER_IMAGE=${PTC_SERVER_IMAGE:-ptc-sandbox-server:latest}
SERVER_BASE_IMAGE=${PTC_SERVER_BASE_IMAGE:-ptc-debootstrap-server-base:bookworm}
SUITE=${PTC_DEBIAN_SUITE:-bookworm}
# Debian's CLI: a docker CLI elsewhere on PATH may expect buildx for `docker build`.
DOCKER=${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}
export DOCKER_BUILDKIT=0

log() { echo "build_images: $*" >&2; }

debian_mirror() {
  # The first Debian mirror apt is configured with (deb822 .sources or one-line .list).
  local uri
  uri=$(grep -hsE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
  if [ -z "$uri" ]; then
    uri=$(grep -hsE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
          | grep -E '/debian/?$' | head -n1 || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

build_debootstrap_base() {
  # $1: the image tag; $2: the packages to include (comma-separated)
  local tag=$1 include=$2
  if have_image "$tag" && [ "${PTC_REBUILD_BASE:-0}" != 1 ]; then
    log "base image $tag is present (cached)"
    return
  fi
  command -v debootstrap >/dev/null || { log "debootstrap is not installed"; exit 1; }
  local mirror root started
  mirror=$(debian_mirror)
  root=$(mktemp -d /var/tmp/ptc-rootfs.XXXXXX)
  trap "rm -rf '$root'" EXIT
  started=$(date +%s)
  log "debootstrap $SUITE from $mirror (minbase + $include) into $root"
  # --variant=minbase: essential packages only. python3 brings python3.11 and its stdlib.
  debootstrap --variant=minbase --include="$include" --components=main \
    "$SUITE" "$root" "$mirror" >/var/tmp/ptc-debootstrap.log 2>&1 \
    || { tail -n 40 /var/tmp/ptc-debootstrap.log >&2; exit 1; }
  # What a runtime image never needs: package caches and lists, docs, man pages, locales.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
         "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
         "$root"/usr/share/locale/* "$root"/var/log/* "$root"/tmp/* "$root"/root/.cache
  log "importing the root filesystem as $tag"
  tar -C "$root" --numeric-owner -c . \
    | "$DOCKER" import --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
  rm -rf "$root"
  trap - EXIT
  log "base image built in $(( $(date +%s) - started )) s"
}

guest_sha256() {
  # Must match sandbox.backends.docker.image.guest_sha256: the GUEST_FILES in order.
  local files=("$@")
  (cd sandbox/guest && cat "${files[@]}") | sha256sum | cut -d' ' -f1
}

build_server() {
  local base=${SERVER_BASE:-}
  if [ -z "$base" ]; then
    build_debootstrap_base "$SERVER_BASE_IMAGE" python3,python3-venv,python3-pip,bubblewrap,libseccomp2
    base=$SERVER_BASE_IMAGE
  fi
  local ctx started python
  python=${PYTHON:-.venv/bin/python}
  [ -x "$python" ] || python=python3
  ctx=$(mktemp -d /var/tmp/ptc-server-ctx.XXXXXX)
  trap "rm -rf '$ctx'" EXIT
  cp -r Dockerfile .dockerignore pyproject.toml setup.py README.md LICENSE sandbox stubs_gen "$ctx/"
  mkdir -p "$ctx/images/server"
  cp images/server/entrypoint.sh "$ctx/images/server/"
  mkdir "$ctx/wheelhouse"
  started=$(date +%s)
  # The wheels are fetched here, where the package index is reachable; the image build is not.
  log "building the wheelhouse with $python"
  "$python" -m pip wheel -q --wheel-dir "$ctx/wheelhouse" "$ctx[docker,mcp,metrics]" \
    >/var/tmp/ptc-wheelhouse.log 2>&1 || { tail -n 30 /var/tmp/ptc-wheelhouse.log >&2; exit 1; }
  log "building $SERVER_IMAGE on $base"
  "$DOCKER" build --network none --pull=false --force-rm -q --build-arg "BASE_IMAGE=$base" \
    -t "$SERVER_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  trap - EXIT
  log "server image $SERVER_IMAGE built in $(( $(date +%s) - started )) s"
}

main() {
  local base=${BASE_IMAGE:-}
  if [ -z "$base" ]; then
    build_debootstrap_base "$DEBOOTSTRAP_IMAGE" python3
    base=$DEBOOTSTRAP_IMAGE
  fi
  # The guest files, by the list the backends use.
  local files
  read -r -a files <<<"$(sed -n 's/^GUEST_FILES = (\(.*\))$/\1/p' sandbox/guest/__init__.py | tr -d '",')"
  [ ${#files[@]} -gt 0 ] || { log "cannot read GUEST_FILES from sandbox/guest/__init__.py"; exit 1; }
  local ctx started
  ctx=$(mktemp -d /var/tmp/ptc-image-ctx.XXXXXX)
  trap "rm -rf '$ctx'" EXIT
  mkdir "$ctx/guest"
  cp images/Dockerfile "$ctx/Dockerfile"
  for f in "${files[@]}"; do cp "sandbox/guest/$f" "$ctx/guest/$f"; done
  started=$(date +%s)
  log "building $RUNTIME_IMAGE on $base"
  "$DOCKER" build --network none --pull=false --force-rm -q \
    --build-arg "BASE_IMAGE=$base" \
    --build-arg "PTC_GUEST_SHA256=$(guest_sha256 "${files[@]}")" \
    --label "org.ptc-sandbox.base=$base" \
    -t "$RUNTIME_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  trap - EXIT
  log "runtime image $RUNTIME_IMAGE built in $(( $(date +%s) - started )) s"
  if [ "${1:-}" = "--server" ]; then
    build_server
  fi
}

main "$@"
