"""Who may read a run's files: its owner alone by default (issue 18 item 2).

A run folder holds the model (``final.npz``, ``v*.npz``, orbax shards), the tape, snapshots
and logs. Every process of a run sets the umask :func:`private` gives, so what it creates
is ``0700`` (folders) and ``0600`` (files); with group access (``dipsjax run
--group-access``, or ``DIPSJAX_GROUP_ACCESS=1`` in the environment, which the role
processes inherit) ``0750`` and ``0640``. The credentials are always the owner's alone,
and :func:`check_secret` refuses a key or token others may read."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

#: The environment variable that grants the owner's group read access to run folders.
GROUP_ACCESS_ENV = "DIPSJAX_GROUP_ACCESS"


def group_access() -> bool:
    """Whether run folders are readable by the owner's group (``DIPSJAX_GROUP_ACCESS=1``)."""
    return os.environ.get(GROUP_ACCESS_ENV, "") == "1"


def umask() -> int:
    """The umask of a run's processes: ``0o077`` (the owner alone), or ``0o027`` with group
    access (the group may read, never write)."""
    return 0o027 if group_access() else 0o077


def private() -> int:
    """Sets this process's umask to :func:`umask` (every process of a run calls it first);
    returns the previous one."""
    return os.umask(umask())


@contextlib.contextmanager
def restricted() -> Iterator[None]:
    """:func:`private` for the ``with`` block (a launcher's; the processes it starts
    inherit it), then the caller's umask again: a notebook or test that launches a run
    keeps its own."""
    old = private()
    try:
        yield
    finally:
        os.umask(old)


def make_dir(path: str | Path) -> Path:
    """``path`` (and its missing parents) as a run folder: ``0700``, or ``0750`` with group
    access, whatever the umask was when it was made."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    p.chmod(0o750 if group_access() else 0o700)
    return p


def tighten(path: str | Path, group: bool) -> int:
    """Takes from every file and folder under ``path`` (``path`` included) the bits the
    run's umask would not have given: all of the group's and others' (``group``: the
    group's write and all of others'); returns how many it changed. It only takes bits away
    (a ``0600`` file stays ``0600`` with ``group``), and never follows a link, so nothing
    outside the run folder changes: a run folder an older version wrote (``0644`` files,
    ``0755`` folders) is resumed as private as a new one."""
    drop = 0o027 if group else 0o077
    root = Path(path)
    entries = [root]
    for folder, dirs, files in os.walk(root):  # links to folders are listed, not entered
        entries += [Path(folder, name) for name in (*dirs, *files)]
    changed = 0
    for p in entries:
        st = p.stat() if p == root else p.lstat()  # the root is the run folder, however named
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode) or not mode & drop:
            continue
        p.chmod(mode & ~drop)
        changed += 1
    return changed


def check_secret(path: str | Path) -> None:
    """Raises ``PermissionError`` naming ``path``, and the fix, when it is not ours (another
    user could replace the key or token, or read them), when anyone but its owner may read
    or write it (a key or a token), or when it is a folder others may write."""
    p = Path(path)
    st = p.stat()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"credentials: {p} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()}): "
            f"`chown {os.geteuid()} {p}`, or make a fresh set with `dipsjax credentials DIR`"
        )
    if p.is_dir():
        # Sticky (a Kubernetes secret volume is 1777): others may add, never replace.
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise PermissionError(
                f"credentials: {p} is writable by others (mode {mode:04o}): `chmod 700 {p}`"
            )
        return
    if mode & 0o077:
        raise PermissionError(
            f"credentials: {p} may be read by others (mode {mode:04o}): the key and the "
            f"token must be the owner's alone: `chmod 600 {p}`"
        )
