"""Compiled kernels kept on disk between processes: AOTInductor packages in the cache folder.

A traced graph is compiled ahead of time by AOTInductor (``torch.export`` then
``torch._inductor.aoti_compile_and_package``) into one ``.pt2`` package: the kernels as a
shared library and the graph's constants. A later process loads it with torch's
package loader (``torch._C._aoti.AOTIModelPackageLoader``) without tracing or compiling
anything, and runs it as the compiled graph ran (benchmarks/NOTES.md compares this with
torch's portable compile caches, which still trace and compile in every process).

The folder is ``_settings.cache_dir()``. Each kernel is two files: its package, named by
the key and the package's own SHA-256 (``<key>-<sha>.pt2``), and a manifest ``<key>.json``
naming that package, its checksum, the format and what the key was made of. Both are
written under a temporary name in the folder and moved into place with ``os.replace``,
the package first, so a manifest only ever names a whole package; two processes compiling
one key each write their own package and the last manifest wins, naming a good one. A
kernel is loaded only when its manifest parses, names this key and format, and its
package's checksum matches; else (corrupt, truncated, foreign) it is rebuilt, with one
``CompileWarning``. A folder that cannot be written (read-only, full) or that lies inside
a git work tree keeps the kernel in this process only, with one ``CompileWarning``.

A package is a shared library this process runs, so it is loaded only from what this user
alone could have written (``marquardt.devices.trust``): before any load or write, the
folders from the cache root (``MARQUARDT_CACHE_DIR``) down to this one, and the package
and its manifest, are checked (owned by this user, not writable by group or others).
Where that fails, nothing is loaded from or written there (one ``UntrustedCacheWarning``)
and the call runs without it. Folders are created 0700 and files written 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from marquardt.devices import trust

from ..._errors import CompileWarning, user_stacklevel
from ..._settings import CACHE_DIR_ENV, cache_dir, cache_root
from . import build_lock

__all__ = [
    "FORMAT",
    "STATS",
    "WRAPPER_OPT_LEVEL",
    "Kernel",
    "clear",
    "compile_exported",
    "compile_package",
    "entries",
    "exported",
    "keep",
    "key_of",
    "load",
    "save",
    "trusted",
    "writable_folder",
]

#: The manifest's format: a manifest of another format is foreign (rebuilt).
FORMAT = "marquardt-aoti-1"
#: What this process did with the disk cache: kernels ``loaded`` from it, ``compiled``
#: and ``saved`` into it, and ``rebuilt`` after a bad artifact.
STATS = {"loaded": 0, "compiled": 0, "saved": 0, "rebuilt": 0}
#: Leftover temporary files older than this many seconds are removed when a key is saved.
STALE_SECONDS = 3600.0
#: The most seconds a compile waits for another process building the same key.
BUILD_WAIT = 900.0
#: The C++ compiler's optimisation of a package's wrapper (the C++ that calls its kernels
#: in turn), inductor's default; the kernels' own code keeps inductor's "O3". "O0" saves a
#: quarter of the wrappers' compile at the same call times (benchmarks/NOTES.md).
WRAPPER_OPT_LEVEL = "O0"

#: Keys whose kept files failed the trust check in this process: neither loaded nor
#: written again here.
UNTRUSTED: set[str] = set()

#: A loaded kernel: tensors in, tensors out, in the traced graph's order.
Kernel = Callable[..., tuple[torch.Tensor, ...]]
_SAID: set[str] = set()


def key_of(description: dict[str, Any]) -> str:
    """The key of a kernel: the SHA-256 of its description (JSON, keys sorted), in hex."""
    text = json.dumps(description, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _say_once(topic: str, text: str) -> None:
    if topic in _SAID:
        return
    _SAID.add(topic)
    warnings.warn(text, CompileWarning, stacklevel=5)


def _in_work_tree(folder: Path) -> bool:
    return any((place / ".git").exists() for place in (folder, *folder.parents))


def trusted(*paths: Path) -> bool:
    """Whether the folders from the cache root down to each of ``paths`` and the paths
    themselves pass ``marquardt.devices.trust.check`` (else one warning says which fails).

    **Arguments:** ``paths``: folders or files in the cache folder.

    **Returns:** True where every existing one passes.
    """
    verdict = trust.check(str(cache_root()), *(str(path) for path in paths))
    if not verdict.trusted:
        level = user_stacklevel() + 1
        trust.warn_untrusted(verdict, "compiled kernels", CACHE_DIR_ENV, stacklevel=level)
    return verdict.trusted


def _folder() -> Path | None:
    """The cache folder, or None (with one warning) where it lies in a git work tree or
    another account could have written to it."""
    folder = cache_dir()
    if _in_work_tree(folder.resolve()):
        _say_once(
            "repository",
            f"compiled kernels are not kept in {folder.resolve()}: it lies inside a git work "
            f"tree, and kernels stay in this process only. HINT: set {CACHE_DIR_ENV} to a "
            "folder outside any repository",
        )
        return None
    return folder if trusted(folder) else None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file ``path`` with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, trust.FILE_MODE)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _package_loader(path: Path, device: torch.device) -> Kernel:
    if device.type != "cuda":
        index = -1
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
    runner = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(runner.run(list(tensors)))

    return run


def _verified(folder: Path, key: str) -> Path:
    """The package the manifest of ``key`` names, its checksum checked.

    Raises ``ValueError`` or ``OSError`` where the manifest or package cannot be used."""
    record = json.loads((folder / f"{key}.json").read_text())
    if record.get("format") != FORMAT or record.get("key") != key:
        raise ValueError("its manifest belongs to another key or format")
    package = folder / str(record["package"])
    if not trusted(package):
        UNTRUSTED.add(key)
        raise PermissionError(f"{package} could have been written by another account")
    if hashlib.sha256(package.read_bytes()).hexdigest() != record["sha256"]:
        raise ValueError("its checksum does not match")
    return package


def load(key: str, device: torch.device) -> tuple[Kernel | None, bool]:
    """(the kernel kept for ``key`` or None, whether one was kept but cannot be trusted:
    then one ``CompileWarning`` says it is rebuilt, and ``STATS["rebuilt"]`` counts it)."""
    folder = _folder()
    manifest = None if folder is None else folder / f"{key}.json"
    if folder is None or manifest is None or not manifest.is_file():
        return None, False
    if not trusted(manifest):
        UNTRUSTED.add(key)
        return None, False
    try:
        kernel = _package_loader(_verified(folder, key), device)
    except Exception as err:  # a bad artifact is rebuilt, never trusted
        if key in UNTRUSTED:  # another account's: neither loaded nor rebuilt here
            return None, False
        STATS["rebuilt"] += 1
        _say_once(
            f"bad:{key}",
            f"the compiled kernel {manifest} cannot be used ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else 'unreadable'}); compiling it "
            "again. HINT: python -m marquardt.solver.cache clear removes every kept kernel",
        )
        return None, True
    STATS["loaded"] += 1
    return kernel, False


def exported(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
    """The traced ``graph`` exported (``torch.export``) for ``inputs``: what
    ``compile_exported`` compiles, and what ``torch.export.save`` can write."""
    # The compiler, imported only when a kernel is compiled, and before the export, whose
    # tracer looks for the compiler's higher-order operations.
    import torch._inductor

    return torch.export.export(graph, tuple(inputs), strict=False)


def compile_exported(program: Any, path: Path) -> None:
    """Compile the exported ``program`` ahead of time into the AOTInductor package ``path``."""
    import torch._inductor

    # The wrapper at WRAPPER_OPT_LEVEL: its compile is most of the system compiler's time.
    with torch._inductor.config.patch(
        {"aot_inductor.compile_wrapper_opt_level": WRAPPER_OPT_LEVEL}
    ):
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))


def compile_package(graph: torch.fx.GraphModule, inputs: list[torch.Tensor], path: Path) -> None:
    """Compile the traced ``graph`` ahead of time into the AOTInductor package ``path``."""
    compile_exported(exported(graph, inputs), path)


def writable_folder() -> Path | None:
    """The cache folder, created private where missing, or None where kernels may not be
    kept there (inside a git work tree, another account could write to it, or it cannot
    be created); the first two say so once."""
    folder = _folder()
    if folder is None:
        return None
    try:
        trust.make_private(str(cache_root()), str(folder))
    except OSError:
        return None
    return folder


def save(
    key: str | None,
    description: dict[str, Any],
    build: Callable[[Path], None],
    device: torch.device,
) -> Kernel:
    """Build the package for ``key`` (``build(path)`` writes it), keep it in the cache
    folder (module docstring) and return it loaded; where there is no key (a model
    without a fingerprint), the key's kept files failed the trust check, or the folder
    cannot be written, the package is built in a temporary folder, loaded from there and
    dropped (the last with one warning). Where another process builds the key, this waits
    for it (up to ``BUILD_WAIT`` seconds) and loads what it kept.

    Raises what ``build`` raises (the caller then runs eagerly)."""
    folder = None if key is None or key in UNTRUSTED else _folder()
    if key is not None and folder is not None:
        try:
            trust.make_private(str(cache_root()), str(folder))
            package = keep(folder, key, description, build, BUILD_WAIT)
            if package is not None:
                return _package_loader(package, device)
        except OSError as err:
            _say_once(
                "unwritable",
                f"compiled kernels cannot be kept in {folder} ({type(err).__name__}: "
                f"{err.strerror or err}); they stay in this process only. HINT: set "
                f"{CACHE_DIR_ENV} to a writable folder with free space",
            )
    with tempfile.TemporaryDirectory(prefix="marquardt-kernel-") as scratch:
        path = Path(scratch) / "kernel.pt2"
        build(path)
        STATS["compiled"] += 1
        return _package_loader(path, device)


def keep(
    folder: Path,
    key: str,
    description: dict[str, Any],
    build: Callable[[Path], None],
    wait: float,
) -> Path | None:
    """Build the package of ``key`` into ``folder`` and write its manifest (both atomic,
    0600), holding the key's build lock (``build_lock.held``) so that no two processes
    build one key.

    **Arguments:** ``folder``: a folder ``writable_folder`` gave; ``key``, ``description``:
    the kernel's; ``build(path)``: writes the package; ``wait``: the most seconds to wait
    for another builder of the key.

    **Returns:** the kept package (one another builder kept meanwhile, where it did), or
    None where another builder held the key for all of ``wait``.

    Raises what ``build`` raises, and ``OSError`` where the folder cannot be written.
    """
    about = {"name": description.get("name"), "kind": description.get("kind")}
    with build_lock.held(folder, key, about, wait) as mine:
        if not mine:
            return None
        try:
            return _verified(folder, key)  # built by the builder this one waited for
        except (OSError, ValueError):
            pass
        for left in folder.glob(f".tmp-{key}-*"):  # a killed builder's half-made files
            left.unlink(missing_ok=True)
        return _saved(folder, key, description, build)


def _saved(
    folder: Path,
    key: str,
    description: dict[str, Any],
    build: Callable[[Path], None],
) -> Path:
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    scratch = folder / f".tmp-{key}-{token}.pt2"
    note = folder / f".tmp-{key}-{token}.json"
    try:
        _write_private(note, "")  # a read-only or full folder fails here, before the compile
        build(scratch)
        os.chmod(scratch, trust.FILE_MODE)
        STATS["compiled"] += 1
        sha = hashlib.sha256(scratch.read_bytes()).hexdigest()
        package = folder / f"{key}-{sha[:16]}.pt2"
        os.replace(scratch, package)
        record = {
            "format": FORMAT,
            "key": key,
            "package": package.name,
            "sha256": sha,
            "bytes": package.stat().st_size,
            "created": time.time(),
            "description": description,
        }
        _write_private(note, json.dumps(record, indent=1, sort_keys=True, default=str))
        os.replace(note, folder / f"{key}.json")
    finally:
        for left in (scratch, note):
            left.unlink(missing_ok=True)
    STATS["saved"] += 1
    _drop_stale(folder, key, package.name)
    return package


def _drop_stale(folder: Path, key: str, kept: str) -> None:
    """Remove this key's packages that no manifest names and old temporary files (another
    writer's, left by a crash), once they are older than ``STALE_SECONDS``."""
    now = time.time()
    for path in [*folder.glob(f"{key}-*.pt2"), *folder.glob(".tmp-*")]:
        try:
            if path.name != kept and now - path.stat().st_mtime > STALE_SECONDS:
                path.unlink()
        except OSError:
            pass


def entries() -> list[dict[str, Any]]:
    """Every kernel kept in the cache folder: its manifest's fields, the manifest's path
    (``manifest``) and the trust check's verdict on it and its package (``verdict``); a
    manifest that does not parse is listed with ``error``."""
    folder = cache_dir()
    found = []
    root = str(cache_root())
    for manifest in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(manifest.read_text())
        except (OSError, ValueError) as err:
            record = {"error": f"{type(err).__name__}: {err}"}
        package = [str(folder / str(record["package"]))] if "package" in record else []
        verdict = trust.check(root, str(manifest), *package)
        found.append({**record, "manifest": str(manifest), "verdict": verdict.describe()})
    return found


def clear() -> tuple[int, int]:
    """Remove every kernel, manifest and temporary file from the cache folder; returns
    (files removed, bytes freed)."""
    folder = cache_dir()
    count = size = 0
    paths = [*folder.glob("*.pt2"), *folder.glob("*.json"), *folder.glob(".tmp-*")]
    paths += list(folder.glob("builds.log"))
    for path in paths if folder.is_dir() else []:
        try:
            length = path.stat().st_size
            path.unlink()
        except OSError:
            continue
        count, size = count + 1, size + length
    return count, size
