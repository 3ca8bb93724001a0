"""Golden files for a small mixed-dialect manifest (module and compact form).

To update the expected files after an intended change to the output::

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/stubs_gen/test_golden.py

then review the diff of ``tests/stubs_gen/golden/`` and bump ``GENERATOR_VERSION``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stubs_gen import load_manifest, render_compact, render_module

HERE = Path(__file__).parent
MANIFEST = HERE / "golden_manifest.json"
GOLDEN = HERE / "golden"


@pytest.mark.parametrize(
    ("filename", "render"),
    [("tools.py.golden", render_module), ("compact.py.golden", render_compact)],
)
def test_golden(filename: str, render: object) -> None:
    manifest = load_manifest(MANIFEST.read_bytes())
    assert callable(render)
    text: str = render(manifest)
    expected = GOLDEN / filename
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        expected.write_text(text, encoding="utf-8")
    assert text == expected.read_text(encoding="utf-8"), (
        f"{filename} differs from the golden file: if intended, run "
        "UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/stubs_gen/test_golden.py"
    )
    assert manifest.warnings == ()
