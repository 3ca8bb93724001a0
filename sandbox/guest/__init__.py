"""In-sandbox code: the guest bootstrap and the stub runtime.

Everything in this folder runs *inside* the sandbox, under the sandbox's own interpreter, with
the standard library only. It imports nothing from the host side, and the host imports nothing
from it but what this file exports: where the files are (`GUEST_DIR`), the lists of files the
backends copy into the sandbox (`GUEST_FILES`, `ZYGOTE_FILES`), and the zygote's fork loop in C
(`forkloop.c`) as the package's install built it (`fork_loop_library`), copied in as
`FORK_LOOP_FILE`.
"""

from pathlib import Path

__all__ = ["FORK_LOOP_FILE", "GUEST_DIR", "GUEST_FILES", "ZYGOTE_FILES", "fork_loop_library"]

GUEST_DIR = Path(__file__).resolve().parent
GUEST_FILES = ("bootstrap.py", "_ptc_runtime.py", "_files.py", "_threads.py")
# The process backend's fork server and the confinement it applies to each child; a container
# is confined by its engine and starts the bootstrap directly, so its image has only the above.
ZYGOTE_FILES = ("zygote.py", "_confine.py", "_forkloop.py")
# The fork loop in C as it is named in the runtime directory (`_forkloop.LIBRARY`).
FORK_LOOP_FILE = "libforkloop.so"


def fork_loop_library() -> Path | None:
    """``forkloop.c`` built (as the extension ``sandbox.guest.libforkloop``: a plain C library
    that no one imports), or None when the package was installed without a C compiler."""
    built = sorted(GUEST_DIR.glob("libforkloop*.so"))
    return built[0] if built else None
