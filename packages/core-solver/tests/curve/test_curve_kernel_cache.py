"""The kept kernels' keys and store (``_curve.kernel_cache.fingerprint``, ``kernel_key``,
``artifacts``) and ``python -m marquardt.solver.cache``. Nothing is compiled here: the
store is driven with a stand-in build and loader (what a real package does is checked in
``test_curve_fit_batch_compiled``)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import marquardt.solver._curve.kernel_cache.artifacts as artifacts
from marquardt.devices import UntrustedCacheWarning, cache_folder, trust
from marquardt.solver import cache
from marquardt.solver._curve.batch.model import BatchModel
from marquardt.solver._curve.batched_lm.state import BatchData
from marquardt.solver._curve.kernel_cache import kernel_key
from marquardt.solver._curve.kernel_cache.fingerprint import fingerprint
from marquardt.solver._curve.threads import torch_threads
from marquardt.solver._errors import CompileWarning

RATE = 2.0


def decay(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
    return a * torch.exp(-k * t)


def _key(
    f: Any,
    fits: int = 8,
    points: int = 12,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
) -> str:
    """The on-disk key of the iteration kernel of f for these shapes."""
    p = torch.zeros(fits, 2, dtype=dtype, device=device)
    y = torch.zeros(fits, points, dtype=dtype, device=device)
    data = BatchData(
        torch.zeros(points, dtype=dtype, device=device),
        y,
        None,
        None,
        p,
        p,
        ("linear",),
        torch.zeros(fits, dtype=torch.int64, device=device),
        p[:, 0],
    )
    shapes = kernel_key.shapes(f, p, data, False)
    described = kernel_key.description(f, shapes, fits, BatchModel(f, points, False), p.device)
    assert described is not None
    return artifacts.key_of(described)


def test_the_key_changes_with_the_code_constants_shapes_dtype_and_device_not_threads() -> None:
    def same(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
        return a * torch.exp(-k * t)

    def other(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
        return a * torch.exp(-k * t) + 1.0

    def closing(rate: float) -> Any:
        def f(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
            return a * torch.exp(-k * rate * t)

        return f

    def global_rate(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
        return a * torch.exp(-k * RATE * t)

    def tensor_rate(rate: torch.Tensor) -> Any:
        return lambda t, a, k: a * torch.exp(-k * rate * t)

    base = _key(decay)
    assert _key(decay) == base
    # The same code under another name is another model (its name is in the key) ...
    assert _key(same) != base
    # ... and code, captured constants, shapes, dtype and device each change the key.
    assert _key(other) != _key(same)
    assert _key(closing(1.0)) != _key(closing(2.0))
    assert _key(closing(1.0)) == _key(closing(1.0))
    assert _key(tensor_rate(torch.tensor(1.0))) != _key(tensor_rate(torch.tensor(1.5)))
    assert _key(tensor_rate(np.array([1.0]))) != _key(tensor_rate(np.array([1.5])))
    before = _key(global_rate)
    globals()["RATE"] = 3.0
    try:
        assert _key(global_rate) != before
    finally:
        globals()["RATE"] = 2.0
    assert _key(decay, fits=16) != base
    assert _key(decay, points=13) != base
    assert _key(decay, dtype=torch.float32) != base
    assert _key(decay, device="meta") != base
    # One kernel per model, shapes and dtype for every thread count: a change in the
    # machine's load (which changes the call's threads) never asks for another.
    with torch_threads(torch.get_num_threads() + 1):
        assert _key(decay) == base


def test_a_model_that_cannot_be_read_has_no_fingerprint() -> None:
    class Opaque:
        def __call__(self, t: torch.Tensor, a: Any) -> torch.Tensor:
            return a * t

    assert fingerprint(decay) is not None
    assert fingerprint(Opaque()) is None
    module = torch.nn.Linear(2, 1)
    first = fingerprint(module)
    with torch.no_grad():
        module.weight.add_(1.0)
    assert first is not None and fingerprint(module) not in (None, first)


def _stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader that reads the package's bytes as the number the kernel adds."""

    def loader(path: Path, device: torch.device) -> Any:
        shift = float(Path(path).read_text())
        return lambda x: (x + shift,)

    monkeypatch.setattr(artifacts, "_package_loader", loader)


def _build(value: float) -> Any:
    return lambda path: Path(path).write_text(str(value))


CPU = torch.device("cpu")


def test_a_kept_kernel_is_loaded_by_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    _stand_in(monkeypatch)
    assert artifacts.load("k1", CPU) == (None, False)
    saved = artifacts.save("k1", {"name": "decay"}, _build(3.0), CPU)
    assert float(saved(torch.tensor(1.0))[0]) == 4.0
    kernel, bad = artifacts.load("k1", CPU)
    assert kernel is not None and not bad and float(kernel(torch.tensor(1.0))[0]) == 4.0
    folder = tmp_path / "compiled"
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []
    assert [e["key"] for e in cache.entries()] == ["k1"]


@pytest.mark.parametrize("damage", ["truncated", "foreign", "garbled"])
def test_a_bad_artifact_is_refused_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, damage: str
) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artifacts, "_SAID", set())
    _stand_in(monkeypatch)
    artifacts.save("k2", {}, _build(3.0), CPU)
    manifest = tmp_path / "compiled" / "k2.json"
    record = json.loads(manifest.read_text())
    if damage == "truncated":
        (tmp_path / "compiled" / record["package"]).write_text("3")
    elif damage == "foreign":
        manifest.write_text(json.dumps({**record, "key": "another"}))
    else:
        manifest.write_text("{not json")
    with pytest.warns(CompileWarning, match="cannot be used") as caught:
        assert artifacts.load("k2", CPU) == (None, True)
        assert artifacts.load("k2", CPU) == (None, True)
    assert len(caught) == 1
    # Saved again, it is good again.
    artifacts.save("k2", {}, _build(5.0), CPU)
    kernel, bad = artifacts.load("k2", CPU)
    assert kernel is not None and not bad and float(kernel(torch.tensor(0.0))[0]) == 5.0


def test_an_unwritable_folder_keeps_the_kernel_in_the_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(artifacts, "_SAID", set())
    _stand_in(monkeypatch)
    real = os.open

    def read_only(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path).parent == tmp_path / "kernels" / "compiled":
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.warns(CompileWarning, match="stay in this process only") as caught:
        first = artifacts.save("k3", {}, _build(2.0), CPU)
        second = artifacts.save("k4", {}, _build(1.0), CPU)
    assert len(caught) == 1
    assert float(first(torch.tensor(1.0))[0]) == 3.0 and float(second(torch.tensor(1.0))[0]) == 2.0
    assert list((tmp_path / "kernels" / "compiled").iterdir()) == []


def test_a_folder_inside_a_repository_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".git").mkdir()
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(artifacts, "_SAID", set())
    _stand_in(monkeypatch)
    with pytest.warns(CompileWarning, match="inside a git work tree"):
        kernel = artifacts.save("k5", {}, _build(1.0), CPU)
    assert float(kernel(torch.tensor(1.0))[0]) == 2.0
    assert not (tmp_path / "kernels").exists()


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    import marquardt.solver._curve.kernel_cache.artifacts as artifacts
    artifacts._package_loader = lambda path, device: (lambda x: (x,))
    value = sys.argv[1]
    def build(path):
        Path(path).write_text(value * 100_000)
        time.sleep(1.0)  # both writers hold a half-made artifact at once
    artifacts.save("shared", {}, build, torch.device("cpu"))
    """
)


def test_two_writers_of_one_key_leave_one_good_artifact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {**os.environ, "MARQUARDT_CACHE_DIR": str(tmp_path)}
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, v], env=env, stderr=subprocess.PIPE)
        for v in "ab"
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artifacts, "_package_loader", lambda path, device: Path(path))
    tmp_path = tmp_path / "compiled"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        package, bad = artifacts.load("shared", CPU)
    assert not bad and package is not None
    assert package.read_text() in ("a" * 100_000, "b" * 100_000)  # type: ignore[attr-defined]
    assert [p.name for p in tmp_path.glob("*.json")] == ["shared.json"]
    assert list(tmp_path.glob(".tmp-*")) == []


def _listed_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, key: str) -> None:
    """One kernel kept in a cache folder at ``tmp_path``, listed by the command."""
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    _stand_in(monkeypatch)
    artifacts.save(key, {"name": "decay", "kind": "iteration", "fits": 8}, _build(1.0), CPU)
    assert cache.main(["list"]) == 0


def test_the_command_lists_and_clears_the_kernels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _listed_kernel(monkeypatch, tmp_path, "k6")
    assert "decay iteration 8 fits" in capsys.readouterr().out
    assert cache.main(["clear"]) == 0
    assert "removed 2 files" in capsys.readouterr().out
    assert cache.entries() == [] and list((tmp_path / "compiled").iterdir()) == []
    assert cache.folder() == tmp_path / "compiled"


def test_a_kernel_is_built_for_the_idle_machines_threads_whatever_the_load() -> None:
    small, large = 1_000, 50_000_000
    assert kernel_key.build_threads(small, CPU, most=4) == 1
    cores = len(os.sched_getaffinity(0))
    assert kernel_key.build_threads(large, CPU, most=4) == min(4, cores)
    assert kernel_key.build_threads(large, torch.device("meta"), most=4) == 1


def test_the_kernels_folder_is_compiled_in_the_devices_cache_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("MARQUARDT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(sys, "platform", "linux")
    assert cache.folder() == tmp_path / "xdg" / "marquardt" / "compiled"
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path / "root"))
    assert cache.folder() == Path(cache_folder()) / "compiled" == tmp_path / "root" / "compiled"


def _damage(kind: str, folder: Path) -> Path:
    """Make the kept kernel in ``folder`` something another account could have written;
    returns the path the warning must name."""
    if kind == "folder 0777":
        folder.chmod(0o777)
        return folder
    if kind == "package 0666":
        package = next(folder.glob("*.pt2"))
        package.chmod(0o666)
        return package
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root (the CI containers run as root)")
    os.chown(folder, 12345, 12345)
    return folder


DAMAGES = ["folder 0777", "package 0666", "folder of another user"]


@pytest.mark.parametrize("kind", DAMAGES)
def test_a_kernel_others_could_have_written_is_neither_loaded_nor_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(trust, "_WARNED", set())
    monkeypatch.setattr(artifacts, "UNTRUSTED", set())
    _stand_in(monkeypatch)
    artifacts.save("k7", {}, _build(3.0), CPU)
    folder = tmp_path / "compiled"
    named = _damage(kind, folder)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.warns(UntrustedCacheWarning, match="HINT: chmod go-w") as caught:
        assert artifacts.load("k7", CPU) == (None, False)
        kernel = artifacts.save("k7", {}, _build(4.0), CPU)  # built, used, not kept
    assert len(caught) == 1 and str(named) in str(caught[0].message)
    assert float(kernel(torch.tensor(0.0))[0]) == 4.0
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_fresh_cache_is_private(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path / "fresh"))
    _stand_in(monkeypatch)
    artifacts.save("k8", {}, _build(1.0), CPU)
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "fresh" / "compiled").stat().st_mode & 0o777 == 0o700
    files = list((tmp_path / "fresh" / "compiled").iterdir())
    assert len(files) == 2 and all(p.stat().st_mode & 0o777 == 0o600 for p in files)


def test_the_listing_gives_each_folders_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _listed_kernel(monkeypatch, tmp_path, "k9")
    out = capsys.readouterr().out
    assert (
        f"folder {tmp_path}: trusted" in out and f"folder {tmp_path / 'compiled'}: trusted" in out
    )
    next((tmp_path / "compiled").glob("*.pt2")).chmod(0o666)
    (tmp_path / "compiled").chmod(0o777)
    assert cache.main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"folder {tmp_path / 'compiled'}: untrusted" in out and "writable by" in out
    assert "[untrusted:" in out
