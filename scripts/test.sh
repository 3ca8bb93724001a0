#!/usr/bin/env bash
# The README's test command (`make test`): on a fresh Debian machine, installs and starts what
# the tests need, runs the whole suite, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dev
exec .venv/bin/python -m pytest "$@"
