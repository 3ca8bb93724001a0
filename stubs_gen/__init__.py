"""stubs_gen: tool manifests in any dialect -> typed Python stub modules, plus argument validation.

Public API (the sandbox's broker and the server depend on exactly this)::

    manifest = load_manifest(text_or_json)        # raises ManifestError on bad input
    render_module(manifest)                       # the module scripts import as `tools`
    render_compact(manifest)                      # the prompt form a model reads
    manifest.validate("get_weather", {"city": 1}) # ["argument 'city': expected string, got 1"]

Modules, one concept each: `dialects` (envelopes), `schema` (schema dialects -> JSON Schema
2020-12), `options` (``x-ptc``), `names` (Python names), `types` (JSON Schema -> Python types),
`docs` (docstrings), `annotations` (types -> ``ast``), `render` (the module), `compact` (the
prompt form), `validate` (argument validation), `model` (the data classes), `loader` (the
pipeline), `errors` (`ManifestError`).
"""

from __future__ import annotations

from stubs_gen.compact import render_compact
from stubs_gen.errors import ManifestError
from stubs_gen.loader import load_manifest
from stubs_gen.model import Manifest, ToolOptions, ToolSpec
from stubs_gen.render import render_module
from stubs_gen.version import GENERATOR_VERSION

__all__ = [
    "GENERATOR_VERSION",
    "Manifest",
    "ManifestError",
    "ToolOptions",
    "ToolSpec",
    "load_manifest",
    "render_compact",
    "render_module",
]
