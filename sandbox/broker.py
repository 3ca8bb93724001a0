"""The broker moved into the execution wing: `sandbox.execution.broker`. This name stays for
callers that import it from here; nothing on the execution path does."""

from sandbox.execution.broker import RECORD_OVERHEAD_BYTES, Broker

__all__ = ["RECORD_OVERHEAD_BYTES", "Broker"]
