"""The zygote's side of its fork loop in C (`forkloop.c`, which says why it is C).

The host copies the built library into the runtime directory as ``libforkloop.so`` when it has
one and wants it (`ProcessBackendConfig.native_fork_loop`); `load` finds it beside this file.
Without it, or when it cannot be loaded here (another ABI version, a runtime directory on a
``noexec`` mount), the zygote forks from its Python loop: the same requests, answers and
isolation, about 0.2 ms more CPU per sandbox (the zygote 0.25 more, its children a little less).
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from typing import Any

# Not "_forkloop.so": `import _forkloop` would take that for this module.
LIBRARY = "libforkloop.so"
ABI = 1  # forkloop.c's PTC_FORK_LOOP_ABI
MAX_FDS = 8
MAX_MESSAGE = 4096

CHILD, EOF, MESSAGE, FORK_FAILED = 0, 1, 2, 3


class _Request(ctypes.Structure):
    """`struct ptc_fork_request`."""

    _fields_ = [
        ("outcome", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("fd_count", ctypes.c_int32),
        ("fds", ctypes.c_int32 * MAX_FDS),
        ("tmp_bytes", ctypes.c_int64),
        ("reaper", ctypes.c_int32),
        ("direct", ctypes.c_int32),
        ("length", ctypes.c_int32),
        ("message", ctypes.c_uint8 * MAX_MESSAGE),
    ]


@dataclass(frozen=True)
class Served:
    """What ended a run of the loop: a child to set up (``child``), the host gone (``eof``), a
    message for the Python loop (``message``: its bytes and descriptors), or a fork that failed
    (``error``, with the request's descriptors still open)."""

    kind: str
    fds: list[int]
    message: bytes = b""
    tmp_bytes: int = 0
    reaper: bool = False
    direct: bool = False
    error: OSError | None = None


class NativeForkLoop:
    """`forkloop.c`'s ``ptc_fork_loop``, bound to this interpreter's fork hooks and the clone
    the zygote proved (`_confine.CloneIntoPidNamespace`)."""

    def __init__(
        self, library: Any, clone_flags: int, tid_address: int, clone_allowed: bool
    ) -> None:
        self._loop = library.ptc_fork_loop
        self._loop.restype = ctypes.c_int
        self._loop.argtypes = [
            ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_Request),
        ]  # fmt: skip
        api = ctypes.pythonapi
        self._hooks = tuple(
            ctypes.cast(getattr(api, name), ctypes.c_void_p).value
            for name in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child")
        )
        self._clone = (clone_flags, tid_address, int(clone_allowed))
        self._request = _Request()

    def serve(self, control_fd: int) -> Served:
        """Forks for each well-formed request until something else comes."""
        request = self._request
        while True:
            outcome = self._loop(control_fd, *self._clone, *self._hooks, ctypes.byref(request))
            if outcome != -errno.EINTR:  # a signal: its Python handler has run; go on
                break
        fds = list(request.fds[: request.fd_count])
        if outcome == CHILD:
            return Served("child", fds, b"", request.tmp_bytes, bool(request.reaper),
                          bool(request.direct))  # fmt: skip
        if outcome == EOF:
            return Served("eof", [])
        if outcome == MESSAGE:
            return Served("message", fds, bytes(request.message[: request.length]))
        if outcome == FORK_FAILED:
            what = os.strerror(request.error)
            error = OSError(request.error, f"clone3: {what}" if request.direct else what)
            return Served("error", fds, error=error)
        raise OSError(-outcome, f"control socket: {os.strerror(-outcome)}")


def load(clone_flags: int, tid_address: int, clone_allowed: bool) -> NativeForkLoop | str | None:
    """The C loop; None when the host gave none; or why the one it gave cannot serve."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY)
    if not os.path.exists(path):
        return None
    try:
        library = ctypes.PyDLL(path)
        abi = library.ptc_fork_loop_abi()
    except (OSError, AttributeError) as exc:
        return f"the native fork loop cannot be loaded: {exc}"
    if abi != ABI:
        return f"the native fork loop is ABI {abi}, this zygote speaks {ABI}"
    return NativeForkLoop(library, clone_flags, tid_address, clone_allowed)
