"""Child process: start Legate, do a small product and Cholesky factorisation, report.

Run as ``python worker_smoke.py`` (with ``env_for_legate_cpu``) or under the ``legate``
launcher; prints one result line (see ``legate_support.emit``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupynumeric as cn
import numpy as np
from legate.core import TaskTarget, get_legate_runtime

from legate_support import emit


def main() -> None:
    rng = np.random.default_rng(7)
    tall = rng.standard_normal((400, 24))
    j = cn.array(tall)
    gram = j.T @ j + 1e-3 * cn.eye(24)
    lower = cn.linalg.cholesky(gram)
    expected = tall.T @ tall + 1e-3 * np.eye(24)
    machine = get_legate_runtime().machine
    emit(
        {
            "gram_error": float(np.max(np.abs(np.asarray(gram) - expected))),
            "factor_error": float(np.max(np.abs(np.asarray(lower @ lower.T) - expected))),
            "scale": float(np.max(np.abs(expected))),
            "cpus": int(machine.count(TaskTarget.CPU)),
            "gpus": int(machine.count(TaskTarget.GPU)),
        }
    )


if __name__ == "__main__":
    main()
