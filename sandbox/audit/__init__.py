"""The audit store: every admitted execution and every tool call it made, append-only."""
