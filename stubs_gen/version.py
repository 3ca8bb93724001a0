"""The generator's version, written into every module header so a cached module can be traced.

Bump it whenever the rendered output changes for the same manifest.
"""

from __future__ import annotations

__all__ = ["GENERATOR_VERSION"]

GENERATOR_VERSION = "1.1.0"
