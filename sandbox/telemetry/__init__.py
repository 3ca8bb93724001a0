"""Seeing inside the service: OpenTelemetry traces (`tracing`, `spans`), Prometheus metrics
(`metrics`) and live progress (`progress`). Each is off and free until configured; nothing here
imports OpenTelemetry or prometheus_client until it is turned on."""

from sandbox.telemetry.progress import LiveProbe, ProgressSnapshot

__all__ = ["LiveProbe", "ProgressSnapshot"]
