"""Who owns a sandbox container, and removing what a crashed server left behind.

Every container carries the owner label `<host>:<pid>:<start time>` of the server process that
created it, and its channel directory lives under `<runtime root>/owner-<pid>-<start time>/`.
At start-up the backend removes the containers and directories of owners on this host whose
process is gone (a pid reused since has another start time). Containers of live servers, and of
other hosts sharing the engine, are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
from pathlib import Path

import docker.errors
import requests.exceptions
from docker import DockerClient
from docker.models.containers import Container

from sandbox.backends.docker.spec import LABEL_BACKEND, LABEL_MANAGED, LABEL_OWNER

__all__ = [
    "OwnerToken",
    "clean_leftovers",
    "owner_dir_name",
    "owner_label",
    "remove_owned",
    "this_owner",
]

log = logging.getLogger(__name__)
# The engine's own errors, and its API not answering in time (a container stuck in a runtime's
# start holds dockerd's locks): a janitor that cannot clean says so and lets the backend start.
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
_OWNER_DIR = re.compile(r"^owner-(\d+)-(\d+)$")


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


OwnerToken = tuple[str, int, int]


def this_owner() -> OwnerToken:
    pid = os.getpid()
    return socket.gethostname(), pid, _start_time(pid) or 0


def owner_label(owner: OwnerToken) -> str:
    return f"{owner[0]}:{owner[1]}:{owner[2]}"


def owner_dir_name(owner: OwnerToken) -> str:
    return f"owner-{owner[1]}-{owner[2]}"


def _alive(pid: int, start: int) -> bool:
    return _start_time(pid) == start


def _dead_owner(label: str, hostname: str) -> bool:
    parts = label.rsplit(":", 2)
    if len(parts) != 3:
        return False
    host, pid_text, start_text = parts
    if host != hostname or not pid_text.isdigit() or not start_text.isdigit():
        return False
    return not _alive(int(pid_text), int(start_text))


def clean_leftovers(client: DockerClient, runtime_root: Path) -> int:
    """Removes dead owners' containers and channel directories; returns containers removed."""
    hostname = socket.gethostname()
    try:
        leftovers = client.containers.list(
            all=True, filters={"label": LABEL_MANAGED}, ignore_removed=True
        )
    except _ENGINE_ERRORS as exc:
        log.warning("docker janitor: listing containers failed: %s", exc)
        leftovers = []
    dead = [c for c in leftovers if _dead_owner((c.labels or {}).get(LABEL_OWNER, ""), hostname)]
    removed = _remove_each(dead, "docker janitor")
    if runtime_root.is_dir():
        for entry in runtime_root.iterdir():
            match = _OWNER_DIR.match(entry.name)
            if match and not _alive(int(match[1]), int(match[2])):
                shutil.rmtree(entry, ignore_errors=True)
    if removed:
        log.info("docker janitor: removed %d containers left by a crashed server", removed)
    return removed


def remove_owned(client: DockerClient, owner: OwnerToken, backend: str | None = None) -> int:
    """Removes every container this owner still has: the last sweep of `close()`, for removals
    that failed while the engine was busy. Returns how many it removed."""
    labels = [f"{LABEL_OWNER}={owner_label(owner)}"]
    if backend is not None:  # only this backend's: the server may run a runc and a runsc one
        labels.append(f"{LABEL_BACKEND}={backend}")
    try:
        mine = client.containers.list(all=True, filters={"label": labels}, ignore_removed=True)
    except _ENGINE_ERRORS as exc:
        log.warning("docker backend: listing own containers failed: %s", exc)
        return 0
    return _remove_each(mine, "docker backend")


def _remove_each(containers: list[Container], who: str) -> int:
    """Force-removes each container (one gone already is not counted); returns how many."""
    removed = 0
    for container in containers:
        with contextlib.suppress(docker.errors.NotFound):
            try:
                container.remove(force=True, v=True)
                removed += 1
            except _ENGINE_ERRORS as exc:
                log.warning("%s: removing %s failed: %s", who, container.name, exc)
    return removed
