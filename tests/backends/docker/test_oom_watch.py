"""The OOM watch's own contract, on real eventfds (the cgroup v1 notifier's kind): a signalled
notifier's handler runs on the watch's thread, once per notice; a handler that raises does not end
the watch for the others; after `unwatch` its handler never runs again and its descriptor is
closed. The kernel's side (a real container's OOM notice) is
tests/backends/docker/test_docker_evidence.py. The process's one watch is used, as the backend
does: its thread lives as long as the process."""

from __future__ import annotations

import os
import threading

import pytest

from sandbox.backends.docker.oom_watch import OomNotifier, oom_watch


def _notifier() -> OomNotifier:
    return OomNotifier(os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK), eventfd=True)


def test_a_notice_runs_its_handler_once_on_the_watch_thread() -> None:
    watch = oom_watch()
    notifier = _notifier()
    called = threading.Event()
    threads: list[str] = []

    def handler() -> None:
        threads.append(threading.current_thread().name)
        called.set()

    watch.watch(notifier, handler)
    os.eventfd_write(notifier.fd, 1)
    assert called.wait(5)
    called.clear()
    assert not called.wait(0.3), "one notice ran its handler more than once"
    assert threads == ["ptc-docker-oom"]
    os.eventfd_write(notifier.fd, 1)
    assert called.wait(5)
    assert threads == ["ptc-docker-oom"] * 2
    watch.unwatch(notifier)


def test_a_failing_handler_leaves_the_watch_running() -> None:
    watch = oom_watch()
    broken, working = _notifier(), _notifier()
    failed, called = threading.Event(), threading.Event()

    def broken_handler() -> None:
        failed.set()
        raise RuntimeError("a bug in one handler")

    watch.watch(broken, broken_handler)
    watch.watch(working, called.set)
    os.eventfd_write(broken.fd, 1)
    assert failed.wait(5)
    os.eventfd_write(working.fd, 1)
    assert called.wait(5)
    watch.unwatch(broken)
    watch.unwatch(working)


def test_unwatch_stops_the_handler_and_closes_the_descriptor() -> None:
    watch = oom_watch()
    notifier = _notifier()
    called = threading.Event()
    watch.watch(notifier, called.set)
    watch.unwatch(notifier)
    with pytest.raises(OSError):  # closed by the watch
        os.fstat(notifier.fd)
    # A notice the kernel gives a fresh eventfd under the same number reaches no old handler.
    fresh = _notifier()
    try:
        os.eventfd_write(fresh.fd, 1)
        assert not called.wait(0.3)
    finally:
        fresh.close()
    watch.unwatch(notifier)  # twice: nothing
