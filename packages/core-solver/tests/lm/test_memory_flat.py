"""A long LM run keeps memory flat: no growth from step to step (issue 8, "Resources").

Each run is a fresh subprocess (the RSS of this test process carries whatever earlier
tests allocated): 200 LM steps on changing batches of a 1-64-1 tanh network, the resident
set size read after step 20 (warm: allocator pools, workspaces and imports in place) and
after step 200. The growth must stay far below what keeping one Jacobian-sized buffer per
step would add; a control run that does exactly that shows the measurement sees such a
leak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BATCH = 4000
PARAMS = 193  # 1-64-1: 64 + 64 + 64 + 1
STEPS = 200
WARM = 20
J_BYTES = BATCH * PARAMS * 4  # float32

_CHILD = f"""
import json, sys
from pathlib import Path
import torch
from marquardt.solver import LMA

torch.set_num_threads(1)
leak = sys.argv[1] == "leak"
torch.manual_seed(0)
x = torch.linspace(-1, 1, 20000).unsqueeze(1)
y = torch.sinc(10 * x)
model = torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
lma = LMA(model, [torch.device("cpu")], lambda a, b: a - b)
kept = []

def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")

marks = {{}}
g = torch.Generator().manual_seed(1)
for step in range(1, {STEPS} + 1):
    idx = torch.randint(0, len(x), ({BATCH},), generator=g)
    lma.step(x[idx], y[idx], {BATCH} // 2)
    if leak:
        kept.append(torch.ones({BATCH}, {PARAMS}))  # what a leaked J_s per step would hold
    if step in ({WARM}, {STEPS}):
        marks[step] = rss()
print(json.dumps(marks))
"""


def _run(kind: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    return int(marks[str(STEPS)]) - int(marks[str(WARM)])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_rss_does_not_grow_over_200_steps() -> None:
    # A J-sized buffer kept per step adds (STEPS − WARM)·J = 180 × 3 MiB ≈ 530 MiB; a
    # quarter of that is the tolerance (allocator noise is a few MiB).
    tolerance = (STEPS - WARM) * J_BYTES // 4
    growth = _run("plain")
    assert growth < tolerance, f"RSS grew {growth / 2**20:.1f} MiB from step {WARM} to {STEPS}"
    leaked = _run("leak")
    assert leaked > tolerance, (
        f"the control run that keeps one J per step grew only {leaked / 2**20:.1f} MiB: "
        "the measurement would not see a leak"
    )
