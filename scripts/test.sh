#!/usr/bin/env bash
# The README's test command (`make test`): on a fresh Debian machine, as root, installs and
# starts everything the suites need, runs the whole suite, and stops what it started.
#
#   - system packages and .venv with the dev extras       scripts/setup.sh --dev
#   - BFCL's checker in its own venv (.venv-acceptance)   scripts/setup_acceptance.sh
#   - a private dockerd and the runtime image, offline     scripts/ci_docker.sh up|down
#   - a private PostgreSQL cluster                         scripts/postgres.sh start|stop
#   - then the TypeScript SDK's node tests                 clients/typescript: npm test
#
# Extra arguments go to pytest (e.g. `make test ARGS="-k broker"`).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --dev
./scripts/setup_acceptance.sh

cleanup() {
  local rc=$?
  scripts/ci_docker.sh down >/dev/null 2>&1 || true
  scripts/postgres.sh stop >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT

scripts/ci_docker.sh up >/dev/null
# shellcheck disable=SC1091
source "${PTC_DOCKER_ENV_FILE:-/tmp/ptc-docker.env}"
scripts/postgres.sh start >/dev/null
# shellcheck disable=SC1091
source "${PTC_PG_DIR:-/tmp/ptc-postgres}/env"

# scripts/ci_docker.sh installs runsc and registers it: here a gVisor test that cannot run is a
# failure, not a skip, so the tier cannot drop out of CI unnoticed (tests/conftest.py).
export PTC_REQUIRE_GVISOR=1
# The same for the PostgreSQL tests (tests/postgres_support.py): started above, never skipped here.
export PTC_REQUIRE_POSTGRES=1

# Both suites run whatever the other's outcome, and the command fails if either failed.
status=0
.venv/bin/python -m pytest "$@" || status=$?

# The TypeScript SDK's tests (clients/typescript: built, then `node --test`), against real
# `ptc serve` processes they start themselves from .venv/bin.
(cd clients/typescript && PATH="$PWD/../../.venv/bin:$PATH" npm test) || status=$?
exit $status
