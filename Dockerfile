# The PTC Sandbox server's own image (`ptc serve`), not the sandbox runtime (that is images/).
#
#   With a registry:   docker build -t ptc-sandbox-server .
#   Offline:           scripts/build_images.sh --server
#                      (FROM a local debootstrap base with python3-venv, python3-pip, bubblewrap
#                      and libseccomp2, and a wheelhouse built on the host with `pip wheel`, so
#                      the build itself runs with --network none)
#
# The base needs python3 >= 3.11 with venv and pip. A directory `wheelhouse/` in the build
# context (may be empty), when it holds this package's wheel and its dependencies', is the only
# package source (`--no-index`); otherwise pip builds the package and uses its index, and apt
# installs bubblewrap and libseccomp2 when the base lacks them, and a C compiler for as long as
# the package builds (the zygote's fork loop in C, sandbox/guest/forkloop.c; the wheelhouse's
# wheel carries it built).
#
# Running it (see README "Server image" and SECURITY.md "The server image"):
#
#   docker run -d --cap-add SYS_ADMIN --security-opt seccomp=unconfined \
#     --security-opt systempaths=unconfined -p 127.0.0.1:50051:50051 ptc-sandbox-server
#
# The default command serves the process backend on 0.0.0.0:50051 with the tenants file
# /var/lib/ptc/tenants.toml (mount your own; without one the first start writes one with a fresh
# key and prints the key once on stderr, see images/server/entrypoint.sh). The server runs as
# root in the container: the sandboxes themselves run as uid 65534 inside bubblewrap.
#
# What the process backend needs from the engine, and why (the least that works):
#   --cap-add SYS_ADMIN                     bubblewrap creates user, pid, net, ipc, uts and mount
#                                           namespaces and mounts a fresh /proc
#   --security-opt seccomp=unconfined       the engine's default profile refuses unshare/clone of
#                                           namespaces (the backend installs its own filter in
#                                           every sandbox)
#   --security-opt systempaths=unconfined   a masked /proc (the engine's default) cannot be
#                                           mounted again inside the sandbox's pid namespace
#   a writable cgroup filesystem            whole-sandbox memory/pids/CPU limits; a cgroup v2 host
#                                           with --cgroupns=private gives the container its own
#                                           subtree. On a cgroup v1 engine a non-privileged
#                                           container's cgroupfs is read-only: add
#                                           `--allow-degraded` to the command to serve on rlimits
#                                           only (each result names the layers in force), or run
#                                           --privileged where the engine allows it.
# Without these the server still starts and answers, but its health check reports NOT_SERVING
# and executions are refused with the reason (fail closed). `--docker` with the engine's socket
# mounted serves the Docker backend instead.
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 LANG=C.UTF-8

WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY sandbox/ sandbox/
COPY stubs_gen/ stubs_gen/
COPY wheelhouse/ /wheelhouse/
COPY images/server/entrypoint.sh /usr/local/bin/ptc-server-entrypoint
RUN set -eu; \
    if ! command -v bwrap >/dev/null || ! ls /usr/lib/*/libseccomp.so.2 >/dev/null 2>&1; then \
      apt-get update; \
      apt-get install -y --no-install-recommends bubblewrap libseccomp2; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/ptc; \
    if ls /wheelhouse/ptc_sandbox-*.whl >/dev/null 2>&1; then \
      /opt/ptc/bin/pip install --no-index --find-links /wheelhouse 'ptc-sandbox[docker,mcp,metrics]'; \
    else \
      compiler=""; \
      if ! command -v cc >/dev/null; then \
        apt-get update; \
        apt-get install -y --no-install-recommends gcc libc6-dev; \
        compiler="gcc libc6-dev"; \
      fi; \
      /opt/ptc/bin/pip install '.[docker,mcp,metrics]'; \
      if [ -n "$compiler" ]; then \
        apt-get purge -y --auto-remove $compiler; \
        rm -rf /var/lib/apt/lists/*; \
      fi; \
    fi; \
    rm -rf /wheelhouse /src; \
    /opt/ptc/bin/ptc --help >/dev/null; \
    /opt/ptc/bin/python -c 'import mcp, docker, prometheus_client, sandbox.integrations.mcp_server'; \
    /opt/ptc/bin/python -c 'from sandbox.guest import fork_loop_library as f; assert f(), "the package was built without its fork loop in C (sandbox/guest/forkloop.c): build the wheelhouse where a C compiler is installed"'; \
    mkdir -p /var/lib/ptc

# `ptc` on PATH, for `docker exec <container> ptc health` (a probe) and the rest of the CLI.
ENV PATH=/opt/ptc/bin:$PATH
WORKDIR /var/lib/ptc
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/ptc-server-entrypoint"]
CMD ["serve", "--listen", "0.0.0.0:50051", "--tenants", "/var/lib/ptc/tenants.toml"]
