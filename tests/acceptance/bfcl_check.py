"""Runs BFCL's own AST checker over model outputs; executed in `.venv-acceptance`, not imported.

bfcl-eval imports many provider SDKs (about 9 s), so it lives in its own virtualenv (made by
`scripts/setup_acceptance.sh`) and this process serves many requests: each line on stdin is one
JSON object ``{"cases": [{"id", "category", "functions", "model_output", "possible_answer"}]}``
where ``model_output`` is BFCL's decoded model-output format (``[{"func.name": {"param":
value}}]``); each answer is one line on stdout: ``{id: {"valid", "error", "error_type"}}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bfcl_eval.constants.enums import Language
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

# A model whose config keeps dots in function names, so names are compared as the tools define
# them (the call log records original names).
MODEL = "gorilla-openfunctions-v2"


def verdicts(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for case in cases:
        try:
            verdict = ast_checker(
                case["functions"],
                case["model_output"],
                case["possible_answer"],
                Language.PYTHON,
                case["category"],
                MODEL,
            )
        except Exception as exc:  # the checker's own crash on an entry is that entry's failure
            verdict = {
                "valid": False,
                "error": [f"{type(exc).__name__}: {exc}"],
                "error_type": "checker:crashed",
            }
        out[case["id"]] = {
            "valid": bool(verdict["valid"]),
            "error": [str(e) for e in verdict.get("error", [])],
            "error_type": str(verdict.get("error_type", "")),
        }
    return out


def main() -> None:
    for line in sys.stdin:
        sys.stdout.write(json.dumps(verdicts(json.loads(line)["cases"])) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
