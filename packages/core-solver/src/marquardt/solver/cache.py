"""The compiled kernels kept between processes: where they are, what they are, clearing them.

``curve_fit_batch`` keeps each kernel it compiles in the ``compiled`` folder of the user's
cache folder (``MARQUARDT_CACHE_DIR``, else ``marquardt`` in the platform's cache folder),
so that later runs load it instead of compiling. A kernel is loaded only from folders and
files this user alone could have written (``marquardt.devices.trust``). From a shell:

    python -m marquardt.solver.cache list     # folders' verdicts, kernels, builds running
    python -m marquardt.solver.cache clear    # remove them all
    python -m marquardt.solver.cache path     # the folder

and from Python ``folder()``, ``entries()`` and ``clear()``. Clearing is always safe: a
missing kernel is compiled again when a call needs it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from marquardt.devices import trust

from ._curve.kernel_cache import artifacts, build_lock
from ._settings import cache_dir, cache_root

__all__ = ["builds", "clear", "entries", "folder", "main", "verdicts"]


def folder() -> Path:
    """The folder compiled kernels are kept in.

    **Returns:** its path (which may not exist yet).
    """
    return cache_dir()


def entries() -> list[dict[str, Any]]:
    """The kept kernels.

    **Returns:** one dict per kernel: ``key``, ``package``, ``bytes``, ``created`` (Unix
    time), ``description`` (the model's name and fingerprint, the kind, fits, shapes and
    versions the key is made of) and ``manifest`` (its path); an unreadable manifest has
    ``error`` instead; ``verdict`` is the trust check's on its manifest and package
    (``trusted`` or why not: such a kernel is never loaded).
    """
    return artifacts.entries()


def clear() -> tuple[int, int]:
    """Remove every kept kernel (they are compiled again when needed).

    **Returns:** (files removed, bytes freed).
    """
    return artifacts.clear()


def builds() -> list[dict[str, Any]]:
    """The kernels being built now, in the background or inline, by any process.

    **Returns:** one dict per build: the builder's ``pid``, ``started`` (Unix time),
    ``key``, and the model's ``name`` and the ``kind`` of kernel.
    """
    return build_lock.builds(cache_dir())


def verdicts() -> list[tuple[Path, str]]:
    """The trust check's verdict on each folder from the cache root down to the kernels'.

    **Returns:** (folder, ``trusted`` / ``untrusted: why`` / ``absent``) for the cache root
    and its ``compiled`` folder.
    """
    root = cache_root()
    found = []
    for path in (root, cache_dir()):
        said = trust.check(str(root), str(path)).describe() if path.exists() else "absent"
        found.append((path, said))
    return found


def _line(entry: dict[str, Any]) -> str:
    if "error" in entry:
        return f"unreadable  {entry['manifest']}: {entry['error']}"
    mark = "" if entry.get("verdict", "trusted") == "trusted" else f"  [{entry['verdict']}]"
    about = entry.get("description", {})
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.get("created", 0)))
    return (
        f"{entry.get('key', '?')[:12]}  {about.get('name', '?')} {about.get('kind', '?')} "
        f"{about.get('fits', '?')} fits  {entry.get('bytes', 0) / 1e6:.1f} MB  {created}  "
        f"torch {about.get('torch', '?')}{mark}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m marquardt.solver.cache list|clear|path``.

    **Arguments:**

    - ``argv``: the command's arguments (default: ``sys.argv[1:]``).

    **Returns:** the exit status (0).
    """
    parser = argparse.ArgumentParser(
        prog="python -m marquardt.solver.cache", description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=("list", "clear", "path"))
    args = parser.parse_args(argv)
    if args.command == "path":
        print(folder())
    elif args.command == "list":
        for path, said in verdicts():
            print(f"folder {path}: {said}")
        found = entries()
        for entry in found:
            print(_line(entry))
        for build in builds():
            seconds = time.time() - float(build.get("started", time.time()))
            print(
                f"building {build.get('name', '?')} {build.get('kind', '?')} "
                f"(pid {build.get('pid', '?')}, for {seconds:.0f} s)  {build.get('key', '?')[:12]}"
            )
        print(f"{len(found)} kernels in {folder()}")
    else:
        count, size = clear()
        print(f"removed {count} files ({size / 1e6:.1f} MB) from {folder()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
