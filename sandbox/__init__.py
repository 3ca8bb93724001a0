"""PTC Sandbox: run model-written Python that calls typed tool stubs, in a resource-limited
sandbox, with every tool call validated, dispatched and recorded on the host.

Importing the package (or its client SDK) changes nothing in the caller's process: the one
environment setting the process backend needs is made by the process backend itself
(`sandbox.backends.process`) and by the `ptc` command, never here."""

__all__: list[str] = []
