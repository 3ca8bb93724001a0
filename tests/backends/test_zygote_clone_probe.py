"""The fork server's one-fork clone (`CloneIntoPidNamespace`) finds glibc's thread-id field
even when the thread id is also found elsewhere in the thread control block.

The search for the tid in the control block can match more than one word by coincidence (in a
container the zygote's tid is a small number, which other fields hold too); the zygote then used
to give up and print "forking twice per sandbox: the thread id is at 2 places of the control
block". Here a second copy of the tid is planted in a word glibc leaves unused, *before* the
real field, so the probe meets the wrong candidate first and must reject it by its proof (a
child's locked mutex names the child as owner only when the right field was set).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.requires_bwrap

PROBE = r"""
import ctypes, json, struct, sys, threading
sys.path.insert(0, sys.argv[1])
from sandbox.guest import _confine

plant = int(sys.argv[2])
libc = ctypes.CDLL(None)
libc.pthread_self.restype = ctypes.c_void_p
block = libc.pthread_self()
tid = threading.get_native_id()
word = ctypes.c_int.from_address(block + plant) if plant >= 0 else None
if word is not None:
    assert word.value == 0, "the planted word is in use"
    word.value = tid
raw = ctypes.string_at(block, 1024)
found = [i for i in range(0, 1021, 4) if raw[i : i + 4] == struct.pack("=i", tid)]
cloner = _confine.CloneIntoPidNamespace()
cloner.probe()
if word is not None:
    word.value = 0
offset = cloner._tid_address - block if cloner.available else None
print(json.dumps({"found": found, "available": cloner.available, "offset": offset,
                  "why_not": cloner.why_not}))
"""

# glibc's x86_64 tcbhead_t: `__glibc_unused1` (an int at byte 76, kept for the ABI, never
# written) lies before `struct pthread`'s tid (byte 720 in glibc 2.36).
UNUSED_WORD = 76


def probe(plant: int) -> dict[str, object]:
    # clone3 with CLONE_NEWPID needs CAP_SYS_ADMIN: root, or root of a user namespace.
    prefix = [] if os.geteuid() == 0 else [shutil.which("unshare") or "unshare", "-Ur"]
    done = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE, str(ROOT), str(plant)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_the_probe_proves_the_single_candidate() -> None:
    found = probe(-1)
    assert found["available"] is True, found
    assert found["found"] == [found["offset"]]


@pytest.mark.skipif(
    platform.machine() != "x86_64" or platform.libc_ver()[0] != "glibc",
    reason="the planted word is an unused field of glibc's x86_64 thread control block",
)
def test_a_coincidental_copy_of_the_tid_is_rejected_by_the_proof() -> None:
    baseline = probe(-1)
    assert baseline["available"] is True, baseline
    found = probe(UNUSED_WORD)
    # Two places, the planted one first: the old probe gave up here.
    assert found["found"] == [UNUSED_WORD, baseline["offset"]]
    assert (found["available"], found["offset"], found["why_not"]) == (
        True,
        baseline["offset"],
        "",
    )
