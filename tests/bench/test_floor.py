"""The isolation floor (`bench/floor.py`, `bench/floor_zygote.py`): every step switch gives a
working sandbox, each step does what it says, and a block that goes wrong says why and leaves
nothing behind. Real forks, namespaces and cgroups, as root like the process backend; a few
sandboxes a block, and no timing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.floor import NEEDS, STEPS, Floor, steps_without


@pytest.fixture(scope="module")
def floor() -> Iterator[Floor]:
    floor = Floor()
    yield floor
    floor.close()
    assert floor.proc.returncode == 0
    assert not [d for d in floor._dirs if Path(d).exists()], "the floor left cgroups behind"


def _only(step: str) -> frozenset[str]:
    return frozenset({step, *NEEDS.get(step, ())})


@pytest.mark.parametrize("step", STEPS)
def test_each_step_off_and_alone_prints_1(floor: Floor, step: str) -> None:
    # run() raises unless every sandbox exited 0 having printed exactly "1\n".
    for steps in (steps_without(step), _only(step)):
        reply = floor.run(3, 2, steps)
        assert reply["rate"] > 0 and reply["sandboxes_s"] > 0


def test_all_steps_and_none_print_1(floor: Floor) -> None:
    floor.run(4, 4, STEPS)
    floor.run(4, 4, ())


PROBES = {
    # step: (script, stdout with every step, stdout with that step off)
    "uid": ("import os; print(os.getuid())", "65534\n", "0\n"),
    "pidns": ("import os; print(os.getpid())", "1\n", None),
    "utsns": ("import socket; print(socket.gethostname())", "sandbox\n", None),
    "netns": (
        "import socket; print([n for _, n in socket.if_nameindex()])",
        "['lo']\n",
        None,
    ),
    "caps": (
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])",
        "0000000000000000\n",
        None,
    ),
    "seccomp": (
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')][0])",
        "2\n",
        "0\n",
    ),
    "tmpfs": ("import os; print(os.getcwd(), os.listdir('.'))", "/tmp ['outputs']\n", None),
}


# Dropping the uid to nobody clears the effective set by itself: "caps" shows without it.
BASE = {"caps": steps_without("uid")}


@pytest.mark.parametrize("step", sorted(PROBES))
def test_each_step_takes_effect(floor: Floor, step: str) -> None:
    script, on, off = PROBES[step]
    base = BASE.get(step, frozenset(STEPS))
    floor.run(2, 2, base, script, on)
    without = base & steps_without(step)
    if off is not None:
        floor.run(2, 2, without, script, off)
    else:  # off, the sandbox prints something else: the block fails and says what it printed
        with pytest.raises(RuntimeError, match="stdout b"):
            floor.run(2, 2, without, script, on)


def test_a_failed_block_says_why_and_leaves_no_sandbox(floor: Floor) -> None:
    # Through the bootstrap, its end report says so; without it, its exit status.
    with pytest.raises(RuntimeError, match=r"reported .*'status': 'error', 'exit_code': 3"):
        floor.run(3, 3, STEPS, "import sys; sys.exit(3)", "")
    with pytest.raises(RuntimeError, match=r"\): status 3, stdout b'', ended True"):
        floor.run(3, 3, steps_without("bootstrap"), "import sys; sys.exit(3)", "")
    for directory in floor._dirs:  # no sandbox's cgroup is left in the floor's parent
        assert [d for d in os.listdir(directory) if Path(directory, d).is_dir()] == []
    floor.run(2, 2, STEPS)  # still serving


def test_an_unknown_step_is_refused_by_name(floor: Floor) -> None:
    with pytest.raises(RuntimeError, match=r"unknown steps \['netnz'\]: the steps are"):
        floor.run(1, 1, ["netnz", "cgroup"])
    floor.run(1, 1, STEPS)
