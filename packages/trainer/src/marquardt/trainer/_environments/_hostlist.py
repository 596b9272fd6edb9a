"""Slurm's compressed host lists and task counts, expanded.

``node[01-03,07],gpu-a[1-2]`` names node01, node02, node03, node07, gpu-a1, gpu-a2: a
bracket holds comma-separated numbers or inclusive ranges, a range keeps the zero padding
of its first bound, several brackets in one name expand as a Cartesian product
(``r[1-2]n[1-2]`` → r1n1, r1n2, r2n1, r2n2), and commas outside brackets separate names.
``SLURM_STEP_TASKS_PER_NODE`` uses ``2(x3),1`` for 2, 2, 2, 1.
"""

from __future__ import annotations

import itertools
import re


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_bracket(body: str, source: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if re.fullmatch(r"\d+", item):
            values.append(item)
            continue
        match = re.fullmatch(r"(\d+)-(\d+)", item)
        if match is None:
            raise ValueError(f"cannot read {item!r} inside [...] of host list {source!r}")
        first, last = match.groups()
        if int(last) < int(first):
            raise ValueError(f"range {item!r} runs backwards in host list {source!r}")
        width = len(first)
        values.extend(str(n).zfill(width) for n in range(int(first), int(last) + 1))
    return values


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm host list, in order (``node[01-02]`` → node01, node02)."""
    hosts: list[str] = []
    for name in _split_top_level(text.strip()):
        pieces = re.split(r"(\[[^\]]*\])", name)
        choices = [
            _expand_bracket(p[1:-1], text) if p.startswith("[") else [p] for p in pieces if p
        ]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Tasks on each node from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1`` → [2, 2, 2, 1])."""
    counts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item)
        if match is None:
            raise ValueError(
                f"cannot read {item!r} in tasks-per-node list {text!r} (expected counts like "
                "2(x3),1). HINT: srun sets SLURM_STEP_TASKS_PER_NODE; do not set it by hand"
            )
        count, repeat = match.groups()
        counts.extend([int(count)] * int(repeat or 1))
    return counts
