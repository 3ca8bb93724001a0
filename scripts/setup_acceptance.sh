#!/usr/bin/env bash
# Idempotent set-up of `.venv-acceptance`: the environment in which the BFCL acceptance test runs
# BFCL's own AST checker. bfcl-eval imports many provider SDKs at import time, so it lives apart
# from the main virtualenv: its declared requirements are installed minus `sentence-transformers`
# and `faiss-cpu` (they pull in torch and are not needed by the AST checker), plus `soundfile`.
set -euo pipefail
cd "$(dirname "$0")/.."

BFCL_VERSION=2026.3.23
VENV=.venv-acceptance
PYTHON=${PYTHON:-$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys.executable))' 2>/dev/null || command -v python3)}

stamp=$VENV/.ptc-acceptance-$BFCL_VERSION
[ -f "$stamp" ] && exit 0

[ -x $VENV/bin/python ] || "$PYTHON" -m venv $VENV
$VENV/bin/python -m pip install -q --no-deps "bfcl-eval==$BFCL_VERSION"
# The package's own declared requirements, read back from its metadata, minus the torch pullers.
$VENV/bin/python - > $VENV/requirements.txt <<'PY'
import re
from importlib.metadata import requires

EXCLUDED = {"sentence-transformers", "faiss-cpu"}
for req in requires("bfcl-eval") or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[ <>=!~;\[]", req, maxsplit=1)[0]
    if name.lower().replace("_", "-") not in EXCLUDED:
        print(req)
print("soundfile")
PY
$VENV/bin/python -m pip install -q -r $VENV/requirements.txt
$VENV/bin/python -c 'from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker'
touch "$stamp"
