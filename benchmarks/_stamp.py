"""Where a benchmark's figures were measured: the commit and the machine its
``results/<name>.json`` records, as the report shows them beside each row and section.

``run_all.py`` adds the stamp to every result it writes (``MEASURED``: the commit and the
machine of that run); results written before it was added are read where their own
``machine`` entry says (a description, or the CPU's name alone), and what none records is
shown as "not recorded", never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The key of a result that holds its stamp (``stamp_record``'s form).
MEASURED = "measured"
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Stamp:
    """The commit and machine one benchmark's recorded results were measured on.

    **Arguments:**

    - `commit`: the commit as ``_machine.source_revision`` wrote it ("commit 87e9292",
      "commit 351b946 with uncommitted edits in 1 package source files"), "" where not
      recorded.
    - `cpu`: the CPU's name, "" where not recorded.
    - `cores`: its core count, None where not recorded.
    - `gpu`: the GPU's name, "" for a run without one (or where not recorded).
    - `date`: when the run ended (UTC, "YYYY-MM-DD HH:MM"), "" where not recorded.
    """

    commit: str = ""
    cpu: str = ""
    cores: int | None = None
    gpu: str = ""
    date: str = ""

    def commit_text(self) -> str:
        """The commit in short: "87e9292", "351b946 + edits", or "not recorded"."""
        words = self.commit.split()
        if len(words) < 2 or words[0] != "commit":
            return self.commit or NOT_RECORDED
        return words[1] + (" + edits" if "uncommitted" in self.commit else "")

    def machine_text(self) -> str:
        """The machine in short: "AMD EPYC, 2 cores", an H100 beside it, or "not recorded"."""
        if not self.cpu:
            return self.gpu or NOT_RECORDED
        cpu = self.cpu + (f", {self.cores} cores" if self.cores else "")
        return f"{self.gpu} ({cpu})" if self.gpu else cpu

    def run_text(self, last: str, finished: str) -> str:
        """Which run it was, against the report's last (at commit ``last``, ended at
        ``finished``): "" for the last run's commit (or an unrecorded one), "an earlier run",
        or "another run" (one recorded as ending after the last, as a merged branch's)."""
        if not self.commit or self.commit == last:
            return ""
        return "another run" if self.date and self.date > finished else "an earlier run"

    def cell(self, last: str, finished: str) -> str:
        """The table's cell: the commit (and ``run_text``) and the machine."""
        run = self.run_text(last, finished)
        return f"{self.commit_text()}{', ' + run if run else ''}; {self.machine_text()}"

    def sentence(self, last: str, finished: str) -> str:
        """The section's line: "Measured at: commit …; machine: …", with the run's date
        where recorded and ``run_text``."""
        commit = self.commit or f"commit {NOT_RECORDED}"
        run = self.run_text(last, finished)
        notes = [self.date + " (UTC)"] * bool(self.date)
        notes += [f"{run} than the last, {last}" if run else "the last run's"] * bool(self.commit)
        commit += f" ({'; '.join(notes)})" if notes else ""
        return f"Measured at: {commit}; machine: {self.machine_text()}."


def stamp_record(machine: dict[str, Any], date: str) -> dict[str, Any]:
    """What ``run_all.py`` stores under ``MEASURED``.

    **Arguments:**

    - `machine`: ``_machine.describe()``'s description.
    - `date`: when the run ended (UTC, "YYYY-MM-DD HH:MM").

    **Returns:** the description's source, CPU, core count and (where there is one) GPU,
    and the date.
    """
    kept = ("source", "cpu", "cores", "gpu")
    return {**{k: machine[k] for k in kept if k in machine}, "date": date}


def stamp(data: dict[str, Any] | None) -> Stamp:
    """The stamp of a benchmark's recorded results.

    **Arguments:**

    - `data`: its ``results/<name>.json`` (None where there is none).

    **Returns:** the ``Stamp`` from its ``MEASURED`` entry, else from its ``machine`` entry
    (a description, or the CPU's name alone); what neither records is left empty.
    """
    if not isinstance(data, dict):
        return Stamp()
    found = data.get(MEASURED) or data.get("machine")
    if isinstance(found, str):
        return Stamp(cpu=found)
    if not isinstance(found, dict):
        return Stamp()
    cores = found.get("cores")
    return Stamp(
        commit=str(found.get("source", "")),
        cpu=str(found.get("cpu", "")),
        cores=cores if isinstance(cores, int) else None,
        gpu=str(found.get("gpu", "")),
        date=str(found.get("date", "")),
    )
