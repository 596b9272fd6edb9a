"""Reading processes from /proc, and telling orphans, on real processes started here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from marquardt.devices._proc import (
    ProcessStat,
    holds_file,
    is_orphan,
    lineage,
    read_process,
    same_process,
    user_name,
)
from marquardt.testing.processes import unused_pid

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads /proc, which only Linux has"
)


def stat(pid: int, ppid: int, session: int) -> ProcessStat:
    return ProcessStat(pid, ppid, session, "S", 100, 0, "python", ("python",))


def test_a_child_as_proc_shows_it(real_processes: Any) -> None:
    child = real_processes.sleeper()
    found = read_process(child.pid)
    assert found is not None
    assert (found.pid, found.ppid, found.uid) == (child.pid, os.getpid(), os.getuid())
    assert found.state in {"R", "S"} and not found.exited
    assert found.session == os.getsid(0)
    assert found.argv[0] == sys.executable and found.argv[-1] == str(real_processes.device)
    assert found.command.startswith(sys.executable + " -c ")
    assert same_process(found) == found
    assert is_orphan(found, read_process(os.getpid())) is False
    assert user_name(found.uid) == user_name(os.getuid()) != str(os.getuid())


def test_a_name_with_spaces_and_parentheses() -> None:
    # The kernel's name of a process may hold ") (": the fields after it must still be read.
    script = (
        "import ctypes, time; ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); "
        "print('ready', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        found = read_process(child.pid)
        assert found is not None and found.comm == "a) b (c"
        assert found.ppid == os.getpid() and found.state in {"S", "R"}
        assert found.argv[:2] == (sys.executable, "-c")
    finally:
        child.kill()
        child.wait(timeout=60)
        assert child.stdout is not None
        child.stdout.close()


def test_no_such_process() -> None:
    assert read_process(unused_pid()) is None
    assert read_process(0) is None and read_process(-1) is None


def test_an_exited_child_is_a_zombie_until_collected() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    before = read_process(child.pid)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet collected
    zombie = read_process(child.pid)
    assert zombie is not None and zombie.exited and zombie.state == "Z"
    child.wait(timeout=60)
    assert read_process(child.pid) is None
    assert before is not None and same_process(before) is None


def test_a_reused_pid_is_not_the_same_process(real_processes: Any) -> None:
    found = read_process(real_processes.sleeper().pid)
    assert found is not None
    older = ProcessStat(**{**found.__dict__, "start_ticks": found.start_ticks - 1})
    assert same_process(older) is None


def test_lineage_runs_from_this_process_up() -> None:
    chain = lineage(os.getpid())
    assert [p.pid for p in chain[:2]] == [os.getpid(), os.getppid()]
    assert chain[-1].ppid == 0  # the first process of this PID namespace


@pytest.mark.parametrize(
    ("process", "parent", "expected"),
    [
        (stat(50, 40, 30), stat(40, 30, 30), False),  # its parent, in its session
        (stat(50, 1, 30), stat(1, 0, 1), True),  # adopted by init
        (stat(50, 20, 30), stat(20, 1, 20), True),  # adopted by a subreaper of another session
        (stat(50, 20, 30), None, True),  # the parent is gone
        (stat(50, 1, 50), stat(1, 0, 1), False),  # a session leader: detached on purpose
        (stat(50, 0, 30), None, None),  # its parent lives outside this PID namespace
        (stat(1, 0, 0), None, False),  # init
        (stat(50, 1, 1), stat(1, 0, 1), False),  # a container's init runs it, in its session
    ],
)
def test_orphan_rule(process: ProcessStat, parent: ProcessStat | None, expected: bool) -> None:
    assert is_orphan(process, parent) is expected


def test_a_run_whose_shell_exited_is_an_orphan(real_processes: Any) -> None:
    pid, launcher = real_processes.orphan()
    found = read_process(pid)
    assert found is not None
    assert found.ppid != launcher.pid and found.session != found.pid
    assert is_orphan(found, read_process(found.ppid)) is True


def test_a_run_adopted_by_a_live_subreaper_is_an_orphan(real_processes: Any) -> None:
    pid, reaper = real_processes.orphan("reaper")
    found = read_process(pid)
    assert found is not None and found.ppid == reaper.pid  # the parent is alive...
    parent = read_process(reaper.pid)
    assert parent is not None and parent.session != found.session  # ...but not its session's
    assert is_orphan(found, parent) is True


def test_a_detached_session_leader_is_no_orphan(real_processes: Any) -> None:
    pid, _ = real_processes.orphan("leader")
    found = read_process(pid)
    assert found is not None and found.session == found.pid
    assert is_orphan(found, read_process(found.ppid)) is False


def test_open_device_files(real_processes: Any) -> None:
    child = real_processes.sleeper()
    assert holds_file(child.pid, real_processes.device_files, Path("/proc")) is True
    assert holds_file(child.pid, "/dev/nvidia", Path("/proc")) is False
    assert holds_file(unused_pid(), "/dev/nvidia") is False
