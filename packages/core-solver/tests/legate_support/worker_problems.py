"""Child process: the shared problem suite with backend "cupynumeric" beside "numpy".

Every problem × damping × strategy of ``problems.py`` is solved from its start with both
backends in this process, step for step, and the parameter iterates are compared. Prints
one result line (see ``legate_support.emit``) mapping "problem/damping/strategy" to the
steps taken, final RSS and parameters, why the run ended, and the relative difference of
the iterates step by step, cuPyNumeric against NumPy, and torch against NumPy (how far two
float64 LAPACKs drift apart on that problem).

Usage: ``python worker_problems.py [problem ...]`` under ``env_for_legate_cpu``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from problems import (
    DAMPINGS,
    MAX_STEPS,
    PROBLEM_NAMES,
    STRATEGIES,
    problem,
    suite_lma,
)

from legate_support import emit


def _trajectory(name: str, backend: str, damping: str, strategy: str) -> dict[str, Any]:
    prob = problem(name)
    model = prob.make_model()
    lma = suite_lma(prob, model, backend=backend, damping=damping, strategy=strategy)
    iterates = [prob.params(model).tolist()]
    steps = 0
    for steps in range(1, MAX_STEPS + 1):  # noqa: B007
        _, terminated = lma.step(prob.x, prob.y)
        iterates.append(prob.params(model).tolist())
        if terminated:
            break
    return {
        "backend": lma.backend.name,
        "steps": steps,
        "rss": prob.rss(model),
        "iterates": iterates,
        "termination": str(lma.report.termination),
    }


def _relative(a: list[float], b: list[float]) -> float:
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float((ta - tb).norm() / tb.norm().clamp_min(1e-300))


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    common = min(len(a["iterates"]), len(b["iterates"]))
    return [_relative(a["iterates"][k], b["iterates"][k]) for k in range(common)]


def main(names: list[str]) -> None:
    torch.set_num_threads(1)  # Legate's CPU processor has the other core
    results: dict[str, Any] = {}
    for name in names:
        for damping in DAMPINGS:
            for strategy in STRATEGIES:
                legate = _trajectory(name, "cupynumeric", damping, strategy)
                reference = _trajectory(name, "numpy", damping, strategy)
                # torch beside numpy shows how far two float64 LAPACKs drift on this problem.
                other = _trajectory(name, "torch", damping, strategy)
                results[f"{name}/{damping}/{strategy}"] = {
                    "backend": legate["backend"],
                    "steps": [legate["steps"], reference["steps"]],
                    "rss": [legate["rss"], reference["rss"]],
                    "final": [legate["iterates"][-1], reference["iterates"][-1]],
                    "termination": [legate["termination"], reference["termination"]],
                    "legate_vs_numpy": _differences(legate, reference),
                    "torch_vs_numpy": _differences(other, reference),
                }
    emit(results)


if __name__ == "__main__":
    main(sys.argv[1:] or list(PROBLEM_NAMES))
