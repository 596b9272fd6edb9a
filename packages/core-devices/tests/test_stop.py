"""Stopping real processes that a fake NVML lists on its GPUs: what really happens to them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from marquardt.devices._errors import CleanupError
from marquardt.devices._proc import PROC, read_process
from marquardt.devices._processes import ProcessSurvey
from marquardt.devices._stop import _Handle, stop_orphans, stop_processes
from marquardt.testing.processes import unused_pid


def test_sigterm_ends_a_process_that_honours_it(on_gpu: Any, real_processes: Any) -> None:
    child = real_processes.sleeper("exit")
    on_gpu(child.pid)
    report = stop_processes([child.pid], grace=30, device_files=real_processes.device_files)
    (outcome,) = report.outcomes
    assert outcome.status == "stopped" and outcome.detail.startswith("stopped by SIGTERM")
    assert report.ok and report.signalled
    assert child.wait(timeout=60) == -signal.SIGTERM  # it was SIGTERM that ended it


def test_sigkill_after_the_grace_for_a_process_that_ignores_sigterm(
    on_gpu: Any, real_processes: Any
) -> None:
    child = real_processes.sleeper("ignore")
    on_gpu(child.pid)
    report = stop_processes([child.pid], grace=0.3, device_files=real_processes.device_files)
    (outcome,) = report.outcomes
    assert outcome.status == "killed", outcome.detail
    assert "killed by SIGKILL (still running 0.3 s after SIGTERM)" in outcome.detail
    assert report.ok
    assert child.wait(timeout=60) == -signal.SIGKILL


def test_an_orphan_adopted_by_init_is_stopped(on_gpu: Any, kit: Any, real_processes: Any) -> None:
    orphan, _ = real_processes.orphan()
    child = real_processes.sleeper()  # on the GPU too, but its parent (this test) is alive
    on_gpu(orphan, child.pid)
    report = stop_orphans(grace=30, device_files=real_processes.device_files)
    assert [(o.pid, o.status) for o in report.outcomes] == [(orphan, "stopped")]
    assert kit.gone(orphan)
    assert child.poll() is None  # not an orphan: left alone


def test_an_orphan_adopted_by_a_subreaper_is_stopped(on_gpu: Any, real_processes: Any) -> None:
    orphan, reaper = real_processes.orphan("reaper")
    on_gpu(orphan)
    report = stop_orphans(grace=30, device_files=real_processes.device_files)
    assert [(o.pid, o.status) for o in report.outcomes] == [(orphan, "stopped")]
    assert reaper.stdout.readline() == f"{int(signal.SIGTERM)}\n"  # how the reaper saw it end


def test_a_detached_session_leader_is_not_an_orphan_to_stop(
    on_gpu: Any, kit: Any, real_processes: Any
) -> None:
    leader, _ = real_processes.orphan("leader")
    on_gpu(leader)
    report = stop_orphans(grace=30, device_files=real_processes.device_files)
    assert report.outcomes == () and not report.signalled
    assert not kit.gone(leader)


@pytest.mark.skipif(os.getuid() != 0, reason="starting another user's process needs root")
def test_another_users_process_is_refused_and_nothing_is_signalled(
    on_gpu: Any, kit: Any, real_processes: Any
) -> None:
    theirs = real_processes.other_users()
    mine = real_processes.sleeper()
    on_gpu(theirs.pid, mine.pid)
    report = stop_processes(
        [mine.pid, theirs.pid], grace=0.3, device_files=real_processes.device_files
    )
    first, second = report.outcomes
    assert (first.pid, first.status) == (mine.pid, "spared")
    assert (second.pid, second.status) == (theirs.pid, "refused")
    assert "belongs to nobody (uid 65534), not to root (uid 0)" in second.detail
    assert "HINT: ask nobody to stop it, or run as that user" in second.detail
    assert not report.ok and not report.signalled
    assert theirs.poll() is None and mine.poll() is None  # both still running
    # Their orphans are left alone too.
    orphans = stop_orphans(uid=os.getuid(), survey=_orphaned(theirs.pid, kit), dry_run=True)
    assert [(o.status, o.detail) for o in orphans.outcomes] == [
        ("left", "left running: nobody's orphan")
    ]


def _orphaned(pid: int, kit: Any) -> ProcessSurvey:
    """A survey listing ``pid`` on GPU 0 as an orphan, for the rules that follow from it."""
    from marquardt.devices._processes import ComputeProcess, GpuProcesses

    process = read_process(pid)
    entry = ComputeProcess(0, kit.uuid(0), None, pid, "C", kit.GiB, None, process, True)
    return ProcessSurvey((GpuProcesses(0, kit.uuid(0), "GPU", (entry,)),))


def test_a_process_of_a_user_other_than_the_caller_is_refused(
    on_gpu: Any, real_processes: Any
) -> None:
    # The process's owner is real; the caller acts for another uid.
    child = real_processes.sleeper()
    on_gpu(child.pid)
    someone = os.getuid() + 4321
    report = stop_processes([child.pid], uid=someone, device_files=real_processes.device_files)
    (outcome,) = report.outcomes
    assert outcome.status == "refused" and f"not to {someone} (uid {someone})" in outcome.detail
    assert child.poll() is None


def test_this_process_and_its_ancestors_are_refused(on_gpu: Any, real_processes: Any) -> None:
    child = real_processes.sleeper()
    on_gpu(os.getpid(), os.getppid(), child.pid)
    # A dry run: even if the checks were wrong, nothing would be sent to this test's shell.
    report = stop_processes(
        [os.getpid(), os.getppid(), child.pid], dry_run=True,
        device_files=real_processes.device_files,
    )  # fmt: skip
    me, parent, other = report.outcomes
    assert (me.status, me.detail) == ("refused", "refused: it is this command itself")
    assert (
        parent.status == "refused" and "ancestor of this command (1 level(s) up)" in parent.detail
    )
    assert other.status == "spared" and "(" + f"{os.getpid()}, {os.getppid()})" in other.detail


ASK_TO_STOP_PARENT = """
import json, os, sys
from marquardt.devices._processes import ProcessSurvey
from marquardt.devices._stop import stop_processes
report = stop_processes([os.getppid()], grace=0.3, force=True, survey=ProcessSurvey(()))
print(json.dumps([(o.status, o.detail) for o in report.outcomes]))
"""


def test_the_shell_that_runs_the_command_survives_it(tmp_path: Path) -> None:
    # A disposable shell runs a command that asks to stop that very shell, with signals.
    script = tmp_path / "ask.py"
    script.write_text(ASK_TO_STOP_PARENT)
    shell = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" "{script}"; status=$?; echo shell lives; exit $status'],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr  # not -15 or -9: the shell was not signalled
    answer, survived = shell.stdout.splitlines()
    ((status, detail),) = json.loads(answer)
    assert status == "refused" and "ancestor of this command" in detail
    assert survived == "shell lives"


def test_a_pid_nvml_does_not_list_needs_force(on_gpu: Any, real_processes: Any) -> None:
    child = real_processes.sleeper()
    on_gpu()  # a GPU without processes
    refused = stop_processes([child.pid], device_files=real_processes.device_files)
    assert refused.outcomes[0].status == "refused"
    assert "NVML lists no compute process" in refused.outcomes[0].detail
    assert "--force" in refused.outcomes[0].detail and child.poll() is None
    forced = stop_processes([child.pid], grace=30, force=True)
    assert forced.outcomes[0].status == "stopped"
    assert child.wait(timeout=60) == -signal.SIGTERM


def test_a_listed_pid_holding_no_gpu_device_here_is_refused(
    on_gpu: Any, real_processes: Any
) -> None:
    # NVML lists the PID, but the process with that PID here has no /dev/nvidia* open: NVML
    # may be reporting another PID namespace's process.
    child = real_processes.sleeper()
    on_gpu(child.pid)
    report = stop_processes([child.pid])  # the real prefix, /dev/nvidia, which it lacks
    (outcome,) = report.outcomes
    assert outcome.status == "refused" and "holds no /dev/nvidia* device open" in outcome.detail
    assert child.poll() is None


def test_gone_pids_are_reported_and_do_not_block(on_gpu: Any, real_processes: Any) -> None:
    child = real_processes.sleeper()
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, exited.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not yet collected
    missing = unused_pid()
    on_gpu(child.pid)
    try:
        report = stop_processes(
            [missing, exited.pid, child.pid], grace=30, device_files=real_processes.device_files
        )
    finally:
        exited.wait(timeout=60)
    assert [(o.status, o.detail) for o in report.outcomes] == [
        ("gone", "already gone: no such process"),
        ("gone", "already exited (a zombie until its parent collects it)"),
        ("stopped", report.outcomes[2].detail),
    ]
    assert report.ok and child.wait(timeout=60) == -signal.SIGTERM


def test_a_pid_nvml_lists_but_this_namespace_lacks_is_refused(on_gpu: Any) -> None:
    elsewhere = unused_pid()
    on_gpu(elsewhere)
    (outcome,) = stop_processes([elsewhere]).outcomes
    assert outcome.status == "refused" and "another PID namespace" in outcome.detail


def test_dry_run_sends_nothing(on_gpu: Any, kit: Any, real_processes: Any) -> None:
    child = real_processes.sleeper()
    orphan, _ = real_processes.orphan()
    on_gpu(child.pid, orphan)
    files = real_processes.device_files
    report = stop_processes([child.pid], grace=7, dry_run=True, device_files=files)
    assert [(o.status, o.detail) for o in report.outcomes] == [
        ("would-stop", "would send SIGTERM, then SIGKILL if still running 7 s later")
    ]
    orphans = stop_orphans(dry_run=True, device_files=files)
    assert [(o.pid, o.status) for o in orphans.outcomes] == [(orphan, "would-stop")]
    assert report.ok and not report.signalled and not orphans.signalled
    assert child.poll() is None and not kit.gone(orphan)


def test_a_reused_pid_is_never_signalled(real_processes: Any) -> None:
    child = real_processes.sleeper()
    now = read_process(child.pid)
    assert now is not None
    earlier = replace(now, start_ticks=now.start_ticks - 1)  # what the PID named before
    handle = _Handle(earlier, PROC)
    try:
        assert not handle.alive() and not handle.send(signal.SIGKILL)
    finally:
        handle.close()
    assert child.poll() is None


def test_without_nvml_stopping_needs_force(fake_nvml: Any, real_processes: Any) -> None:
    child = real_processes.sleeper()
    fake_nvml([], init_error="LibraryNotFound")
    with pytest.raises(CleanupError, match=r"cannot tell .* Nothing was stopped\. HINT: --force"):
        stop_processes([child.pid])
    with pytest.raises(CleanupError, match=r"HINT: find the PIDs with `ps`"):
        stop_orphans()
    assert child.poll() is None
    report = stop_processes([child.pid], grace=30, force=True)
    assert report.outcomes[0].status == "stopped"


@pytest.mark.parametrize(
    ("pids", "options", "message"),
    [
        ([0], {}, r"PIDs \[0\] were given"),
        ([-1], {}, r"would signal process groups"),
        ([5], {"grace": -1.0}, r"grace=-1.0 seconds"),
        ([5], {"kill_wait": float("nan")}, r"kill_wait=nan seconds"),
    ],
)
def test_bad_requests_fail_before_any_work(
    fake_nvml: Any, pids: list[int], options: dict[str, float], message: str
) -> None:
    fake = fake_nvml([])
    with pytest.raises(ValueError, match=message):
        stop_processes(pids, **options)
    assert "nvmlInit" not in fake.calls


def test_without_pidfds_start_times_name_the_process(
    on_gpu: Any, real_processes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    polite, stubborn = real_processes.sleeper("exit"), real_processes.sleeper("ignore")
    on_gpu(polite.pid, stubborn.pid)
    monkeypatch.delattr(os, "pidfd_open")  # as on a kernel older than 5.3
    report = stop_processes(
        [polite.pid, stubborn.pid], grace=3, device_files=real_processes.device_files
    )
    assert [o.status for o in report.outcomes] == ["stopped", "killed"]
    assert polite.wait(timeout=60) == -signal.SIGTERM
    assert stubborn.wait(timeout=60) == -signal.SIGKILL
