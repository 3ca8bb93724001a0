"""Execution backends: each takes one job and returns its outcome behind one small interface.

The seam is `base` (`Backend`, `SandboxHandle`, `Capabilities`), the one factory `factory`, and
the honest fake `fake`; the package re-exports nothing, so that importing one backend's modules
imports no other backend.
"""

__all__: list[str] = []
