"""PTC Sandbox: run model-written Python that calls typed tool stubs, in a resource-limited
sandbox, with every tool call validated, dispatched and recorded on the host."""

__all__: list[str] = []
