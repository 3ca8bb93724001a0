"""A runtime as a Docker image: the Docker backend's runtime image with the runtime's tree in it.

Built offline (``docker build`` with no network: the tree is copied from the host, nothing is
downloaded), ``FROM`` the backend's runtime image, so it inherits its guest files, its label
with their hash, its user and its command. The tree goes to /ptc-runtime (root's, read-only
like the rest of the root file system), and a ``.pth`` file in the interpreter's own site
directory puts /ptc-runtime/site on sys.path: the guest starts with ``-I``, which ignores the
environment and the user's site, never the interpreter's. The image is tagged
``ptc-runtime-<name>:<hash of runtime.json>`` and labelled with its base image's id, so a
runtime rebuilt, or a base image rebuilt since, is found stale rather than used.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sandbox.errors import InvalidArgument, NotFound, Unavailable
from sandbox.runtimes.store import METADATA, MOUNT_POINT, SITE, Runtime

__all__ = ["LABEL_BASE", "LABEL_RUNTIME", "build_image", "image_tag", "usable_image"]

LABEL_RUNTIME = "org.ptc-sandbox.runtime"
LABEL_BASE = "org.ptc-sandbox.runtime-base"

DOCKERFILE = f"""\
ARG BASE
FROM ${{BASE}}
USER 0:0
COPY {SITE}/ {MOUNT_POINT}/{SITE}/
ARG PYTHON_VERSION
ARG RUNTIME
ARG BASE_ID
RUN set -eu; \\
    python3 -c 'import sys; v = "%d.%d" % sys.version_info[:2]; \\
assert v == sys.argv[1], f"the image runs Python {{v}}, the runtime is for {{sys.argv[1]}}"' \\
        "$PYTHON_VERSION"; \\
    dir=$(python3 -c 'import site; print(site.getsitepackages()[0])'); \\
    mkdir -p "$dir"; \\
    echo {MOUNT_POINT}/{SITE} > "$dir/ptc-runtime.pth"; \\
    chmod -R a+rX {MOUNT_POINT}
LABEL {LABEL_RUNTIME}="${{RUNTIME}}" {LABEL_BASE}="${{BASE_ID}}"
# One thread for numerical libraries: a sandbox has one CPU (as on the process backend), and
# OpenBLAS's thread pool does not start under gVisor (its import dies of a SIGINT there).
ENV OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
USER 65532:65532
"""


def image_tag(runtime: Runtime) -> str:
    # The runtime's metadata and how the image is made: either changed is another image.
    source = (runtime.path / METADATA).read_bytes() + DOCKERFILE.encode()
    digest = hashlib.sha256(source).hexdigest()[:12]
    return f"ptc-runtime-{runtime.name}:{digest}"


def build_image(client: Any, runtime: Runtime, base: str) -> str:
    """Builds (offline) and tags the runtime's image on ``base``; returns the tag."""
    import docker

    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound as exc:
        raise Unavailable(
            f"runtime {runtime.name!r}: the base image {base} is missing (scripts/build_images.sh)"
        ) from exc
    tag = image_tag(runtime)
    context = Path(tempfile.mkdtemp(prefix="ptc-runtime-image-"))
    try:
        shutil.copytree(runtime.site, context / SITE, symlinks=True)
        (context / "Dockerfile").write_text(DOCKERFILE, encoding="utf-8")
        client.images.build(
            path=str(context),
            tag=tag,
            network_mode="none",
            rm=True,
            forcerm=True,
            pull=False,
            buildargs={
                "BASE": base,
                "BASE_ID": base_id,
                "PYTHON_VERSION": runtime.python,
                "RUNTIME": runtime.name,
            },
        )
    except docker.errors.BuildError as exc:
        lines = [str(item.get("stream", item.get("error", ""))).strip() for item in exc.build_log]
        detail = " | ".join(line for line in lines if line)[-600:]
        raise InvalidArgument(
            f"runtime {runtime.name!r}: the image build failed: {detail}"
        ) from exc
    except docker.errors.DockerException as exc:
        raise Unavailable(f"runtime {runtime.name!r}: the image build failed: {exc}") from exc
    finally:
        shutil.rmtree(context, ignore_errors=True)
    return tag


def usable_image(client: Any, runtime: Runtime, base: str) -> str:
    """The runtime's image tag when it is built for this runtime and this base; else NotFound
    saying how to build it."""
    import docker

    tag = image_tag(runtime)
    hint = f"build it with `ptc runtime image {runtime.name}`"
    try:
        labels = client.images.get(tag).labels or {}
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound:
        raise NotFound(f"runtime: {runtime.name!r} has no Docker image {tag}; {hint}") from None
    except docker.errors.DockerException as exc:
        raise Unavailable(f"runtime {runtime.name!r}: inspecting {tag} failed: {exc}") from exc
    if labels.get(LABEL_BASE) != base_id:
        raise NotFound(
            f"runtime: {runtime.name!r}: its Docker image {tag} was built on another {base}; {hint}"
        )
    return tag
