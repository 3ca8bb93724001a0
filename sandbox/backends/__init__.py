"""Execution backends: each takes one job and returns its outcome behind one small interface."""
