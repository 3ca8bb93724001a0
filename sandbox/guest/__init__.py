"""In-sandbox code: the guest bootstrap and the stub runtime.

Everything in this folder runs *inside* the sandbox, under the sandbox's own interpreter, with
the standard library only. It imports nothing from the host side, and the host imports nothing
from it but this file's `GUEST_FILES` and `ZYGOTE_FILES`, the lists of files the backends copy
into the sandbox.
"""

from pathlib import Path

GUEST_DIR = Path(__file__).resolve().parent
GUEST_FILES = ("bootstrap.py", "_ptc_runtime.py", "_files.py")
# The process backend's fork server and the confinement it applies to each child; a container
# is confined by its engine and starts the bootstrap directly, so its image has only the above.
ZYGOTE_FILES = ("zygote.py", "_confine.py")
