"""Freed host memory is reused by the next step instead of being faulted in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from marquardt.jacobian import _settings

_PROBE = """
import json, resource, sys, torch
from marquardt.jacobian import JacobianEngine, Replicas
model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b)
from marquardt.jacobian import _host_heap
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # What one step does: several activation-sized blocks, written, then all freed.
    blocks = [torch.ones(10 << 18) for _ in range(3)]  # 3 × 10 MiB
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": _host_heap.keep_host_heap(), "faults": faults}))
"""


def _run(heap: str | None) -> dict[str, object]:
    env = dict(os.environ)
    env.pop(_settings.ENV_HOST_HEAP, None)
    if heap is not None:
        env[_settings.ENV_HOST_HEAP] = heap
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc malloc settings exist on Linux only"
)
def test_a_cpu_engine_keeps_freed_blocks_for_reuse() -> None:
    kept = _run(None)
    system = _run("system")
    assert kept["kept"] is True and system["kept"] is False
    pages = (30 << 20) // 4096
    kept_faults = kept["faults"]
    system_faults = system["faults"]
    assert isinstance(kept_faults, list) and isinstance(system_faults, list)
    # Kept, the same 30 MiB come back from the heap without faults once the heap has grown;
    # left to glibc's defaults, the freed blocks are returned and faulted in again.
    # (The layout of the first rounds varies from run to run: later rounds are compared.)
    assert max(kept_faults[3:]) < pages // 10
    assert system_faults[1] > pages // 2


def test_an_unknown_host_heap_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_settings.ENV_HOST_HEAP, "sometimes")
    with pytest.raises(ValueError, match="keep and system"):
        _settings.host_heap()
