"""Whether a file of the cache folder may be trusted: only what this user could have written.

The cache folder (``cache_folder()``) holds what later processes read back and act on: the
solver's compiled kernels are shared libraries it loads and runs, and the measured machine
rates steer the step-time planner. Whoever can write there can make this process run
their code or choose badly. So, as ssh does with its keys and pip with its cache, a path
is read or written only when it, and every folder from the cache root down to it, is owned
by this process's user (its effective uid; root for a process running as root) and not
writable by group or others. Folders are created 0700 and files 0600, so a cache made by
marquardt passes; a cache shared on purpose (a group folder, a ``chmod -R 777``) is refused
with one ``UntrustedCacheWarning`` naming the folder, its owner and mode and the fix.

On Windows ``os.stat`` gives neither an owner nor write bits for others (its ACLs are not
read here), so there the check passes and the folder's ACLs are the user's to keep
private; the documentation says so.
"""

from __future__ import annotations

import os
import stat
import warnings
from dataclasses import dataclass

from ._errors import UntrustedCacheWarning
from .messages import message

__all__ = ["Verdict", "check", "make_private", "warn_untrusted"]

#: Where the check cannot read owners and modes (module docstring).
CHECKED = os.name == "posix"
#: The mode of the folders the cache creates; files are written with ``FILE_MODE``.
FOLDER_MODE = 0o700
FILE_MODE = 0o600
_WARNED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Verdict:
    """What the check found.

    Arguments:
        path: the first path that failed, or the last one checked when all passed.
        trusted: whether every path checked passed (missing ones are not checked).
        owner: the failing path's owner uid (None when trusted).
        mode: the failing path's permission bits (None when trusted).
        why: what is wrong with it ("" when trusted).
    """

    path: str
    trusted: bool
    owner: int | None = None
    mode: int | None = None
    why: str = ""

    def describe(self) -> str:
        """One line for listings: ``trusted`` or ``untrusted (why)``.

        Returns:
            The verdict in words.
        """
        return "trusted" if self.trusted else f"untrusted: {self.path} {self.why}"


def _one(path: str, uid: int) -> Verdict | None:
    """The failing verdict of one path, or None when it passes or does not exist."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != uid:
        why = f"is owned by uid {info.st_uid}, not by this process's uid {uid}"
    elif mode & (stat.S_IWGRP | stat.S_IWOTH):
        bits = ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others"))
        who = [name for bit, name in bits if mode & bit]
        why = f"is writable by {' and '.join(who)}"
    else:
        return None
    return Verdict(path, False, info.st_uid, mode, why)


def check(root: str, *paths: str) -> Verdict:
    """Check ``root`` and, for each of ``paths`` (each inside ``root``), every folder from
    ``root`` down to it and the path itself (module docstring's rule).

    Arguments:
        root: the cache root (``MARQUARDT_CACHE_DIR`` or the platform's cache folder).
        paths: folders or files inside ``root``.

    Returns:
        The first failing ``Verdict``, else a trusted one. Paths that do not exist pass
        (nothing is read from them; they are created private when written).
    """
    if not CHECKED:
        return Verdict(root, True)
    uid = os.geteuid()
    root = os.path.abspath(root)
    chain = [root]
    for path in paths:
        relative = os.path.relpath(os.path.abspath(path), root)
        if relative.startswith(os.pardir):
            raise ValueError(f"{path} does not lie inside the cache root {root}")
        here = root
        for part in [] if relative == os.curdir else relative.split(os.sep):
            here = os.path.join(here, part)
            if here not in chain:
                chain.append(here)
    for path in chain:
        failed = _one(path, uid)
        if failed is not None:
            return failed
    return Verdict(chain[-1], True)


def make_private(root: str, folder: str) -> None:
    """Create ``folder`` (inside ``root``) and the folders above it that are missing, each
    with mode 0700; folders that exist are left as they are (``check`` judges them).

    Arguments:
        root: the cache root.
        folder: the folder to create, ``root`` itself or inside it.

    Raises:
        OSError: where a folder cannot be created.
    """
    missing = []
    here = os.path.abspath(folder)
    while not os.path.isdir(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            continue
        os.chmod(path, FOLDER_MODE)  # the umask may only have removed bits; say it exactly


def warn_untrusted(verdict: Verdict, what: str, variable: str, stacklevel: int = 3) -> None:
    """One ``UntrustedCacheWarning`` per path and reason in this process.

    Arguments:
        verdict: a failing verdict of ``check``.
        what: what was to be read or written there, e.g. ``"compiled kernels"``.
        variable: the environment variable that moves the cache (named in the hint).
        stacklevel: passed to ``warnings.warn``.
    """
    topic = (verdict.path, verdict.why)
    if topic in _WARNED:
        return
    _WARNED.add(topic)
    mode = "?" if verdict.mode is None else f"{verdict.mode:04o}"
    text = message(
        f"{what} were to be read from or kept in {verdict.path}",
        f"it {verdict.why} (owner uid {verdict.owner}, mode {mode}), so another account "
        "could have written what is there; nothing is read from or written to it and the "
        "work goes on without it",
        f"chmod go-w {verdict.path} (and own it: chown $(id -u) {verdict.path}), or set "
        f"{variable} to a folder of your own",
    )
    warnings.warn(text, UntrustedCacheWarning, stacklevel=stacklevel)
