"""The process backend: bubblewrap sandboxes on the host, limited by rlimits and cgroups.

Importing it turns gRPC's fork handlers off unless the operator said otherwise: the backend
forks (then execs bubblewrap as the sandbox user) in processes where gRPC's threads run (`ptc
serve`), and gRPC's fork handlers, on by default, then restart gRPC's poller in the child and
break the sandbox's start-up (or log "skipping fork() handlers" at every fork); the child execs
at once and never uses gRPC. gRPC reads the setting when it is first initialized (the first
channel or server), so a program that also uses gRPC imports this backend, or sets
``GRPC_ENABLE_FORK_SUPPORT=0`` itself, before that; the `ptc` command sets it before anything.

The package re-exports nothing: its modules are imported by name (`backend.ProcessBackend`,
`pidfd`, ...), so that importing it for the setting above costs nothing more.
"""

import os as _os

__all__: list[str] = []

_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
