"""A real one-node Slurm cluster on this machine, for the integration tests.

The cluster is the Debian packaging of Slurm (22.05 on Debian 12) started by hand, without
systemd: ``munged`` (as the ``munge`` user), ``slurmctld -c`` and one ``slurmd``, all reading
a configuration written into a private directory (``SLURM_CONF`` points at it for every
command). The node advertises two GPUs (``Gres=gpu:2``) backed by two symlinks to
``/dev/null``, so scripts that ask for ``--gpus-per-task`` are scheduled and receive
``CUDA_VISIBLE_DEVICES`` per task exactly as on a GPU node.

When the Slurm or MUNGE programs are missing they are installed with ``apt-get`` (this needs
root, as on the CI machines). Everything started here is stopped by process id at the end:
``scontrol shutdown`` for the Slurm daemons (their pid files are checked), and ``munged`` by
its pid file when it was started here.

Use it from pytest through the session fixture in ``conftest.py``, or by hand::

    python integration_tests/slurm_cluster.py start   # prints the SLURM_CONF to export
    python integration_tests/slurm_cluster.py status
    python integration_tests/slurm_cluster.py stop
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from marquardt.testing.processes import free_port
from slurm_host import (
    SlurmClusterError,
    ensure_installed,
    pid_alive,
    read_pid,
    run,
    start_munge,
    stop_pid,
)

# Where the command line keeps a cluster between `start` and `stop`.
DEFAULT_CLI_DIR = Path(os.environ.get("MARQUARDT_SLURM_DIR", "/tmp/marquardt-slurm"))
STATE_FILE = "cluster.json"
FAKE_GPUS = 2


def _node_line(env: Mapping[str, str]) -> str:
    """This machine's node definition, as ``slurmd -C`` measures it."""
    out = run(["slurmd", "-C"], timeout=30, env=env).stdout
    for line in out.splitlines():
        if line.startswith("NodeName="):
            return line.strip()
    raise SlurmClusterError(f"`slurmd -C` printed no NodeName line:\n{out}")


@dataclass
class SlurmCluster:
    """A one-node Slurm cluster whose files all live in ``root``."""

    root: Path
    node_name: str = ""
    munge_pid: int | None = None  # set only when munged was started here
    installed: bool = False
    started: bool = False
    ctld_port: int = 0
    slurmd_port: int = 0
    _timings: dict[str, float] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm commands: this process's, minus any outer job's SLURM_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
        return env

    # --- files

    def write_config(self) -> None:
        """Write slurm.conf and gres.conf for one node with two (fake) GPUs."""
        for sub in ("state", "spool", "log", "gpu"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # Two device files, so Slurm binds a GPU index per task; /dev/null stands in.
        gpu_files = []
        for i in range(FAKE_GPUS):
            link = self.root / "gpu" / f"nvidia{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
            gpu_files.append(str(link))
        node = _node_line(self.env)
        self.node_name = node.split()[0].split("=", 1)[1]
        self.ctld_port = self.ctld_port or free_port()
        self.slurmd_port = self.slurmd_port or free_port()
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "# One-node cluster for marquardt's integration tests (written by",
                    "# integration_tests/slurm_cluster.py; every path is private to this run).",
                    "ClusterName=marquardt",
                    f"SlurmctldHost={self.node_name}(127.0.0.1)",
                    f"SlurmctldPort={self.ctld_port}",
                    f"SlurmdPort={self.slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "SlurmctldDebug=info",
                    "SlurmdDebug=info",
                    # No cgroups, no systemd: track processes through /proc, bind nothing.
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SchedulerType=sched/backfill",
                    # Refuse at submission what the node can never run, instead of pending.
                    "EnforcePartLimits=ALL",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "MailProg=/bin/true",
                    "ReturnToService=2",
                    "SlurmdTimeout=60",
                    "InactiveLimit=0",
                    "KillWait=5",
                    # sbatch --wait polls every 2 s only while its interval stays under
                    # MinJobAge/2 (otherwise 2, 8, 32 s...); job records live 4 s after the end.
                    "MinJobAge=4",
                    "GresTypes=gpu",
                    f"{node} NodeAddr=127.0.0.1 Gres=gpu:{FAKE_GPUS} State=UNKNOWN",
                    f"PartitionName=debug Nodes={self.node_name} Default=YES "
                    "MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        (self.root / "gres.conf").write_text(
            "# Two GPUs backed by /dev/null: scheduled and bound like real ones.\n"
            "AutoDetect=off\n"
            f"NodeName={self.node_name} Name=gpu File={self.root / 'gpu'}/nvidia[0-{FAKE_GPUS - 1}]\n"
        )

    # --- life cycle

    def _pid(self, daemon: str) -> int | None:
        return read_pid(self.root / f"{daemon}.pid")

    def _daemon_alive(self, daemon: str) -> bool:
        pid = self._pid(daemon)
        return pid is not None and pid_alive(pid)

    def node_state(self) -> str:
        proc = run(["sinfo", "-h", "-N", "-o", "%T"], timeout=15, env=self.env, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def start(self, *, timeout: float = 60.0) -> None:
        """Install if needed, write the configuration, start the daemons, wait for idle."""
        t0 = time.monotonic()
        self.installed = ensure_installed()
        self._timings["install"] = time.monotonic() - t0
        self.root.mkdir(parents=True, exist_ok=True)
        if self._daemon_alive("slurmd") or self._daemon_alive("slurmctld"):
            raise SlurmClusterError(
                f"asked to start a cluster in {self.root} but its daemons are already running. "
                "HINT: stop it first (`python integration_tests/slurm_cluster.py stop`)."
            )
        t1 = time.monotonic()
        self.munge_pid = start_munge()
        self.write_config()
        self.started = True
        self.save_state()
        try:
            run(["slurmctld", "-c"], timeout=30, env=self.env)
            run(["slurmd"], timeout=30, env=self.env)
            self._wait_idle(timeout)
        except Exception:
            self.stop()
            raise
        self._timings["start"] = time.monotonic() - t1
        self.save_state()

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state == "idle":
                return
            if not self._daemon_alive("slurmctld") and self._pid("slurmctld") is not None:
                break
            time.sleep(0.2)
        raise SlurmClusterError(
            f"the node did not become idle within {timeout:.0f} s (last state {state!r}).\n"
            f"{self.logs()}\nHINT: a drained node usually means gres.conf and the node line "
            "disagree; the logs above say why."
        )

    def logs(self, tail: int = 30) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                parts.append(f"--- {path}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, *, timeout: float = 30.0) -> None:
        """Stop slurmd and slurmctld (``scontrol shutdown``), then munged if started here."""
        pids = {d: self._pid(d) for d in ("slurmd", "slurmctld")}
        if any(p is not None and pid_alive(p) for p in pids.values()):
            run(["scontrol", "shutdown"], timeout=15, env=self.env, check=False)
        deadline = time.monotonic() + timeout
        for pid in pids.values():
            if pid is None:
                continue
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            stop_pid(pid, timeout=5)  # only if shutdown did not end it
        if self.munge_pid is not None:
            stop_pid(self.munge_pid)
            self.munge_pid = None
        self.started = False
        self.save_state()

    # --- state for the command line

    def save_state(self) -> None:
        if not self.root.exists():
            return
        state = {
            "root": str(self.root),
            "node_name": self.node_name,
            "munge_pid": self.munge_pid,
            "started": self.started,
            "ctld_port": self.ctld_port,
            "slurmd_port": self.slurmd_port,
        }
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, root: Path) -> SlurmCluster:
        state = json.loads((root / STATE_FILE).read_text())
        return cls(
            root=Path(state["root"]),
            node_name=state["node_name"],
            munge_pid=state["munge_pid"],
            started=state["started"],
            ctld_port=state["ctld_port"],
            slurmd_port=state["slurmd_port"],
        )

    # --- jobs

    def sbatch(
        self,
        script: Path | str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 300.0,
        cwd: Path | str | None = None,
        script_args: Sequence[str] = (),
    ) -> Job:
        """Submit ``script`` with ``sbatch --wait``; return the exit code and its output.

        ``args`` are sbatch options (they override the script's ``#SBATCH`` lines);
        ``script_args`` follow the script name and reach the script as ``$@``.

        The job's output goes to a file in this cluster's folder. On timeout the job is
        cancelled (``scancel``) before the error is raised, so nothing outlives the test.
        """
        out_dir = self.root / "jobs"
        out_dir.mkdir(exist_ok=True)
        fd, out_name = tempfile.mkstemp(prefix="job-", suffix=".out", dir=out_dir)
        os.close(fd)
        job_env = self.env
        job_env.update(env or {})
        cmd = [
            "sbatch",
            "--wait",
            "--parsable",
            f"--output={out_name}",
            f"--chdir={cwd or os.getcwd()}",
            *args,
            str(script),
            *script_args,
        ]
        proc = subprocess.Popen(
            cmd, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            job_id = stdout.strip().split(";")[0]
            if job_id:
                run(["scancel", job_id], timeout=15, env=self.env, check=False)
            output = Path(out_name).read_text(errors="replace")
            raise SlurmClusterError(
                f"job {job_id or '?'} from {script} did not end within {timeout:.0f} s and was "
                f"cancelled.\noutput so far:\n{output}\n{self.logs()}"
            ) from None
        job_id = stdout.strip().split(";")[0]
        return Job(
            job_id=job_id,
            returncode=proc.returncode,
            stderr=stderr,
            output=Path(out_name).read_text(errors="replace"),
            command=cmd,
            state=self.job_state(job_id) if job_id else "",
        )

    def job_state(self, job_id: str) -> str:
        """The controller's final state of a job (``COMPLETED``, ``FAILED``, ``CANCELLED``...).

        ``sbatch --wait`` exits 0 for a job cancelled before it ran, so the state is checked too.
        """
        proc = run(["scontrol", "-o", "show", "job", job_id], timeout=15, env=self.env, check=False)
        for item in proc.stdout.split():
            if item.startswith("JobState="):
                return item.split("=", 1)[1]
        return ""


@dataclass
class Job:
    """A finished batch job: ``sbatch --wait``'s exit code (the job's) and the job output."""

    job_id: str
    returncode: int
    output: str
    stderr: str
    command: list[str]
    state: str = ""

    def describe(self) -> str:
        return (
            f"job {self.job_id} ({' '.join(self.command)}) exited {self.returncode}, "
            f"state {self.state or '?'}\n"
            f"--- sbatch stderr\n{self.stderr}\n--- job output\n{self.output}"
        )


@contextlib.contextmanager
def running_cluster(root: Path | None = None) -> Iterator[SlurmCluster]:
    """A started cluster for the duration of the ``with`` block; stopped even on errors."""
    owned = root is None
    folder = Path(tempfile.mkdtemp(prefix="marquardt-slurm-")) if root is None else root
    cluster = SlurmCluster(root=folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if owned and not os.environ.get("MARQUARDT_KEEP_SLURM_DIR"):
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_CLI_DIR,
        help=f"folder for the configuration, state and logs (default {DEFAULT_CLI_DIR})",
    )
    ns = parser.parse_args(argv)
    root: Path = ns.dir.resolve()
    if ns.action == "start":
        cluster = SlurmCluster(root=root)
        cluster.start()
        print(
            f"Slurm is up: node {cluster.node_name} idle with gpu:{FAKE_GPUS} "
            f"(installed now: {cluster.installed}; start {cluster._timings['start']:.1f} s)."
        )
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    if not (root / STATE_FILE).exists():
        print(
            f"no cluster state in {root}. HINT: start one with `start --dir {root}`.",
            file=sys.stderr,
        )
        return 1
    cluster = SlurmCluster.load(root)
    if ns.action == "status":
        print(
            f"SLURM_CONF={cluster.conf} node {cluster.node_name}: "
            f"{cluster.node_state() or 'not answering'}"
        )
        return 0
    cluster.stop()
    print(f"Slurm stopped ({root}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
