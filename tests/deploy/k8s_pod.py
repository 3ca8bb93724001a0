"""One variant's pod as the variant tests run it: the server image started on the test engine
with exactly the container settings the rendered Deployment gives (`k8s_variants.docker_settings`),
its arguments with `$(VAR)` expanded from its environment as the kubelet does, the ConfigMap's
server.toml and the example tenant of the tenants Secret mounted where the volumes put them; and
what the tests ask of it (health as the probes ask, `ptc run` inside it, its memory cgroup).
The `pod` fixture (conftest.py) starts and ends one per test."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.deploy.k8s_variants import (
    container,
    docker_settings,
    example_tenants,
    rendered,
    server_toml,
)
from tests.server_image import DOCKER, IMAGE, docker, logs

__all__ = ["ADDRESS", "Pod"]

ADDRESS = "127.0.0.1:50051"  # the container's own loopback: --listen=0.0.0.0:50051


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of a container argument."""
    for name, value in env.items():
        arg = arg.replace(f"$({name})", value)
    assert "$(" not in arg, f"{arg}: a variable the container's env does not define"
    return arg


def _pem() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


class Pod:
    """One variant's container, started as the manifest gives it."""

    def __init__(self, variant: str, workdir: Path, without: tuple[str, ...] = ()) -> None:
        self.documents = rendered(variant)
        self.spec = container(self.documents)
        self.name = f"ptc-k8s-{variant}-{uuid.uuid4().hex[:10]}"
        settings = docker_settings(self.documents)
        tenants, self.key = example_tenants(self.documents)
        mounts: list[str] = []
        for path, (kind, detail) in settings.volumes.items():
            if kind == "configMap":
                assert (path, detail) == ("/etc/ptc/server.toml", "server.toml")
                source = workdir / "server.toml"
                source.write_text(server_toml(self.documents))
                mounts += ["--volume", f"{source}:{path}:ro"]
            elif kind == "secret":
                assert (path, detail) == ("/etc/ptc/tenants", "ptc-tenants")
                directory = workdir / "tenants"
                directory.mkdir()
                (directory / "tenants.toml").write_text(tenants)
                (directory / "tenants.toml").chmod(0o400)  # the volume's defaultMode
                mounts += ["--volume", f"{directory}:{path}:ro"]
        # The env the kubelet gives the container: its fieldRef and the replaced Secrets.
        values = {
            "POD_NAME": self.name,
            "POD_IP": "127.0.0.1",  # --network none: loopback is its only address
            "PTC_AUDIT_DB": "/var/lib/ptc/audit.db",
            "PTC_CHECKPOINT_KEY": _pem(),
        }
        assert {e["name"] for e in self.spec["env"]} == set(values)
        env = [item for name, value in values.items() for item in ("--env", f"{name}={value}")]
        args = [_expand(arg, values) for arg in self.spec["args"] if arg not in without]
        assert len(args) == len(self.spec["args"]) - len(without)
        assert "command" not in self.spec  # args go to the image's entrypoint, as here
        self.options = settings.options
        for note in settings.notes:
            print(f"{variant}: {note}")
        self.command = [
            "run", "-d", "--name", self.name, "--network", "none",
            *settings.options, *mounts, *env, IMAGE, *args,
        ]  # fmt: skip

    def start(self) -> float:
        started = docker(*self.command)
        assert started.returncode == 0, started.stderr
        return time.monotonic()

    def state(self, field: str) -> str:
        return docker("inspect", "-f", f"{{{{.State.{field}}}}}", self.name).stdout.strip()

    def health(self, ready: bool) -> str:
        args = ["ptc", "health", "--server", ADDRESS, "--timeout", "3"]
        found = docker("exec", self.name, *args, *(["--ready"] if ready else []))
        return found.stdout.strip() or found.stderr.strip()

    def wait_serving(self, ready: bool, deadline: float) -> float:
        """Polls the health service as the probe does until SERVING; the time it answered."""
        while True:
            assert self.state("Running") == "true", logs(self.name)
            if self.health(ready) == "SERVING":
                return time.monotonic()
            assert time.monotonic() < deadline, (
                f"not {'ready' if ready else 'serving'} within the probe's budget:\n"
                + logs(self.name)
            )
            time.sleep(0.5)

    def run(self, script: str, *limits: str) -> tuple[int, dict[str, Any]]:
        found = self.start_run(script, *limits)
        out, err = found.communicate(script, timeout=120)
        assert out, err + logs(self.name)
        result: dict[str, Any] = json.loads(out)
        return found.returncode, result

    def started(self, script: str, *limits: str) -> subprocess.Popen[str]:
        """`ptc run` of ``script``, started and given the whole script (it runs from here on);
        `finished` reads its result. Several run side by side."""
        run = self.start_run(script, *limits)
        assert run.stdin is not None
        run.stdin.write(script)
        run.stdin.close()
        return run

    def finished(self, run: subprocess.Popen[str]) -> dict[str, Any]:
        """The result of a run `started` gave."""
        assert run.stdout is not None and run.stderr is not None
        with run:
            out = run.stdout.read()
            err = run.stderr.read()
        assert out, err + logs(self.name)
        result: dict[str, Any] = json.loads(out)
        return result

    def start_run(self, script: str, *limits: str) -> subprocess.Popen[str]:
        """`ptc run` in the container, started (several run side by side); the caller passes
        ``script`` to ``communicate``."""
        flags = [item for limit in limits for item in ("--limit", limit)]
        return subprocess.Popen(
            [DOCKER, "exec", "-i", "--env", f"PTC_API_KEY={self.key}", self.name,
             "ptc", "run", "--server", ADDRESS, "--json", *flags, "-"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def memory_cgroup(self) -> Path:
        """The container's memory cgroup on this (v1) engine's host: the pod's, as the kernel
        counts it."""
        full = docker("inspect", "-f", "{{.Id}}", self.name).stdout.strip()
        # os.walk, not Path.glob: on a shared machine other servers' sandbox cgroups come and go
        # during the search, and glob raised FileNotFoundError for one removed under it.
        found = [
            Path(top) / full
            for top, dirs, _files in os.walk("/sys/fs/cgroup/memory", onerror=lambda _e: None)
            if full in dirs
        ]
        (directory,) = found
        return directory

    def working_set_bytes(self) -> int:
        """The container's memory as the kubelet counts it: usage minus inactive file pages."""
        directory = self.memory_cgroup()
        usage = int((directory / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
        return usage - int(stat["total_inactive_file"])

    def oom_kills(self) -> int:
        """The OOM kills the kernel counted in the container's (the pod's) memory cgroup."""
        control = (self.memory_cgroup() / "memory.oom_control").read_text()
        return int(control.split("oom_kill ")[1].split()[0])
