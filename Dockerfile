# The PTC Sandbox server's own image (`ptc serve`), not the sandbox runtime (that is images/).
#
#   With a registry:   docker build -t ptc-sandbox-server .
#   Offline:           scripts/build_images.sh --server
#                      (a debootstrap base with python3-venv and python3-pip, and a wheelhouse
#                      built on the host with `pip wheel`, so the build itself needs no network)
#
# The base needs python3 >= 3.11 with venv and pip. A directory `wheelhouse/` in the build
# context (may be empty), when it holds this package's wheel and its dependencies', is the only
# package source (`--no-index`); otherwise pip builds the package and uses its index. The process backend inside a container needs bubblewrap and user namespaces from
# the host (run with the privileges that allows); the docker backend needs the engine's socket
# and a channel directory shared with the engine's host (PTC_DOCKER_RUNTIME_DIR).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}

ARG PTC_UID=10001
ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 LANG=C.UTF-8

WORKDIR /src
COPY pyproject.toml README.md ./
COPY sandbox/ sandbox/
COPY stubs_gen/ stubs_gen/
COPY wheelhouse/ /wheelhouse/
RUN set -eu; \
    python3 -m venv /opt/ptc; \
    if ls /wheelhouse/ptc_sandbox-*.whl >/dev/null 2>&1; then \
      /opt/ptc/bin/pip install --no-index --find-links /wheelhouse 'ptc-sandbox[docker]'; \
    else \
      /opt/ptc/bin/pip install '.[docker]'; \
    fi; \
    rm -rf /wheelhouse /src; \
    /opt/ptc/bin/ptc --help >/dev/null; \
    echo "ptc:x:${PTC_UID}:${PTC_UID}:ptc server:/var/lib/ptc:/usr/sbin/nologin" >> /etc/passwd; \
    echo "ptc:x:${PTC_UID}:" >> /etc/group; \
    mkdir -p /var/lib/ptc && chown "${PTC_UID}:${PTC_UID}" /var/lib/ptc

WORKDIR /var/lib/ptc
USER ${PTC_UID}:${PTC_UID}
EXPOSE 50051
ENTRYPOINT ["/opt/ptc/bin/ptc"]
CMD ["serve", "--listen", "0.0.0.0:50051"]
