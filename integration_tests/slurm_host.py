"""What the local Slurm cluster needs from this machine: the Slurm and MUNGE programs
(installed with ``apt-get`` where missing, which needs root), a running ``munged``, and
commands run with a timeout that say what ran and what it printed when they fail. The
cluster itself is ``slurm_cluster.py``."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# Debian packages providing each program the cluster needs.
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
SLURM_PROGRAMS = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scontrol", "munged")
MUNGE_PID_FILE = Path("/run/munge/munged.pid")
MUNGE_KEY = Path("/etc/munge/munge.key")


class SlurmClusterError(RuntimeError):
    """The local Slurm cluster could not be installed, started or stopped."""


def run(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a command with a timeout; on failure, say what ran and what it printed."""
    try:
        proc = subprocess.run(
            list(cmd),
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmClusterError(
            f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s.\n"
            f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}"
        ) from exc
    if check and proc.returncode != 0:
        raise SlurmClusterError(
            f"`{' '.join(cmd)}` exited with {proc.returncode}.\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def missing_programs(programs: Sequence[str] = SLURM_PROGRAMS) -> list[str]:
    """The programs among ``programs`` that are not on PATH (``/usr/sbin`` included)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [p for p in programs if shutil.which(p, path=path) is None]


_APT_UPDATED = False


def apt_install(packages: Sequence[str], *, timeout: float = 900.0) -> None:
    """``apt-get install`` the packages, quietly and without questions (root only).

    ``apt-get update`` runs once per process: CI machines start with empty package lists.
    """
    global _APT_UPDATED
    if os.geteuid() != 0:
        raise SlurmClusterError(
            f"asked to install {', '.join(packages)} but this process is not root "
            f"(uid {os.geteuid()}). HINT: run `apt-get install -y {' '.join(packages)}` as root "
            "first, or run the integration tests as root."
        )
    if shutil.which("apt-get") is None:
        raise SlurmClusterError(
            f"asked to install {', '.join(packages)} but apt-get is not available. HINT: "
            "install Slurm (slurmctld, slurmd, client tools) and MUNGE with this system's "
            "package manager."
        )
    env = {
        **os.environ,
        "DEBIAN_FRONTEND": "noninteractive",
        "APT_LISTCHANGES_FRONTEND": "none",
        "NEEDRESTART_MODE": "a",
    }
    if not _APT_UPDATED:
        run(["apt-get", "update", "-qq"], timeout=timeout, env=env)
        _APT_UPDATED = True
    run(
        [
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
            *packages,
        ],
        timeout=timeout,
        env=env,
    )


def ensure_installed() -> bool:
    """Install Slurm and MUNGE from Debian when any program is missing; True if installed."""
    if not missing_programs():
        return False
    apt_install(SLURM_PACKAGES)
    still = missing_programs()
    if still:
        raise SlurmClusterError(
            f"installed {', '.join(SLURM_PACKAGES)} but {', '.join(still)} is still not on "
            "PATH. HINT: check `dpkg -L slurmd slurmctld slurm-client munge`."
        )
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _munge_works() -> bool:
    """Whether a running munged answers (a credential round trip)."""
    if shutil.which("munge") is None or shutil.which("unmunge") is None:
        return False
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(
            ["unmunge"], input=enc.stdout, capture_output=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return dec.returncode == 0


def start_munge(timeout: float = 20.0) -> int | None:
    """Start ``munged`` as the munge user unless one already answers; its pid if started."""
    if _munge_works():
        return None
    user = pwd.getpwnam("munge")
    for folder in (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge")):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, user.pw_uid, user.pw_gid)
    if not MUNGE_KEY.exists():
        # The Debian package creates the key on install; a stripped image may not have it.
        run(["runuser", "-u", "munge", "--", "mungekey", "--create"], timeout=30)
    stale = read_pid(MUNGE_PID_FILE)
    if stale is not None and not pid_alive(stale):
        MUNGE_PID_FILE.unlink(missing_ok=True)
    run(["runuser", "-u", "munge", "--", "munged"], timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = read_pid(MUNGE_PID_FILE)
        if pid is not None and _munge_works():
            return pid
        time.sleep(0.1)
    raise SlurmClusterError(
        f"started munged but it did not answer within {timeout:.0f} s. "
        "HINT: see /var/log/munge/munged.log."
    )


def stop_pid(pid: int, *, timeout: float = 15.0) -> None:
    """SIGTERM a process, then SIGKILL it if it is still alive after ``timeout`` seconds."""
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
