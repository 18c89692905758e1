"""Every file a command writes: never through a symlink, never half-written, a full disk in one line.

Core layer (imports only :mod:`fedxrisk.errors`). :func:`replace_atomic` writes one
file through ``NAME.tmp`` (opened with ``O_EXCL | O_NOFOLLOW`` after removing a stale
one, so a planted ``.tmp`` link is never followed; on Linux written unnamed, ``O_TMPFILE``,
and linked as ``NAME.tmp`` once complete, so a kill -9 mid-write leaves no ``.tmp``), ``fsync`` and a rename;
:func:`write_together` does the same for a set of files that must appear together
(all temporary files are written before the first rename). On any failure the
temporary files are removed; ``ENOSPC``, ``EROFS``, ``EACCES``, ``EPERM`` and
``EDQUOT`` become one :class:`~fedxrisk.errors.OutputError` line naming the path and
what is intact. :func:`check_folder` refuses a non-empty folder that holds none of a
command's own files; :func:`refuse_inputs` refuses an output that is one of the inputs.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from fedxrisk.errors import OutputError

DISK_ERRORS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT})
# creating a file where the system keeps none (``/proc/x.csv``: ENOENT) or through a file (ENOTDIR)
WRITE_ERRORS = DISK_ERRORS | {errno.ENOENT, errno.ENOTDIR}
Writer = Callable[[IO[Any]], None]


def refuse_symlink(path: Path) -> None:
    """An output path that is a symbolic link (even a dangling one) is refused, never followed."""
    if path.is_symlink():
        raise OutputError(
            f"{path} is a symbolic link; fedxrisk never writes through one: remove it or choose another output"
        )


def intact_note(path: Path) -> str:
    return (
        f"the previous {path.name} is unchanged" if path.exists() else f"nothing was written to {path.name}"
    )


def disk_error(e: OSError, path: Path, intact: str) -> OutputError:
    return OutputError(f"cannot write {path}: {e.strerror or e}; {intact}")


@contextmanager
def disk_errors(path: Path, intact: str | None = None) -> Iterator[None]:
    """Turn a full disk, a read-only folder or a refused permission into one line naming ``path``."""
    try:
        yield
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise
        raise disk_error(e, path, intact or intact_note(path)) from None


def make_folder(path: Path) -> None:
    """``mkdir -p``; any folder that cannot be made (a full or read-only disk, ``/proc``, a file in
    the way) is one line naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(
            f"cannot create the folder {path}: {e.strerror or e}; nothing was written"
        ) from None


def _open_new(path: Path, binary: bool) -> IO[Any]:
    """A new file at ``path``: a stale file or link of that name is removed, never followed."""
    try:
        os.unlink(path)  # removes a link itself, not its target
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline="", encoding="utf-8")


def open_append(path: Path) -> IO[Any]:
    """``path`` opened for appending text, refused if it is a symbolic link."""
    refuse_symlink(path)
    flags = (
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    with disk_errors(path):
        fd = os.open(path, flags, 0o666)
    return os.fdopen(fd, "a", newline="", encoding="utf-8")


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_tmp(path: Path, write: Writer, binary: bool) -> Path:
    """``path.tmp``, written in full. On Linux the bytes go to an unnamed file (``O_TMPFILE``) that is
    given the name ``.tmp`` only once complete: a process killed while writing leaves no file."""
    tmp = _tmp(path)
    fd = _open_unnamed(path.parent)
    if fd is None:
        with _open_new(tmp, binary) as f:
            _fill(f, write)
        return tmp
    with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
        _fill(f, write)
        _unlink(tmp)  # a stale file or link of that name; link() never follows one
        folder = os.open(tmp.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:  # a dir fd makes os.link call linkat(…, AT_SYMLINK_FOLLOW): the unnamed file gets a name
            os.link(f"/proc/self/fd/{f.fileno()}", tmp.name, dst_dir_fd=folder, follow_symlinks=True)
        finally:
            os.close(folder)
    return tmp


def _fill(f: IO[Any], write: Writer) -> None:
    write(f)
    f.flush()
    os.fsync(f.fileno())


def _open_unnamed(folder: Path) -> int | None:
    """An unnamed file in ``folder`` (Linux ``O_TMPFILE``), or None where the system has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder or ".", flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None  # a file system without O_TMPFILE: the named .tmp path
        raise


def replace_atomic(path: str | Path, write: Writer, mode: str = "w", intact: str | None = None) -> None:
    """Write ``path`` through ``path.tmp``, fsync and a rename: never a half-written file."""
    write_together({Path(path): (write, mode)}, intact)


def write_together(files: Mapping[Path, tuple[Writer, str]], intact: str | None = None) -> list[Path]:
    """Write every file to its ``.tmp`` first, then rename them all: they appear together or not at all."""
    paths = [Path(p) for p in files]
    for path in paths:
        refuse_symlink(path)
    done: list[Path] = []
    current = paths[0] if paths else Path()
    try:
        for path, (write, mode) in zip(paths, files.values()):
            current = path
            done.append(_write_tmp(path, write, "b" in mode))
        for path in paths:
            current = path
            os.replace(_tmp(path), path)
    except BaseException as e:
        for path in paths:
            _unlink(_tmp(path))
        if isinstance(e, OSError) and e.errno in WRITE_ERRORS:
            note = intact or (
                intact_note(current) if len(paths) == 1 else "no file of this output was replaced"
            )
            raise disk_error(e, current, note) from None
        raise
    return paths


def text_writer(text: str) -> tuple[Writer, str]:
    return (lambda f: f.write(text)), "w"


def bytes_writer(data: bytes) -> tuple[Writer, str]:
    return (lambda f: f.write(data)), "wb"


def check_folder(out: Path, ours: Callable[[Path], bool], what: str, option: str = "--out") -> None:
    """``out`` is new, empty, or holds this command's own files (``ours``); a user's folder is refused."""
    if out.is_symlink() and not out.exists():
        raise OutputError(f"{option} {out} is a dangling symbolic link; choose another folder")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{option} {out} is a file, not a folder")
    if not out.is_dir():
        check_creatable(out, option)
        return
    if ours(out):
        return
    names = sorted(p.name for p in out.iterdir())
    if names:
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        raise OutputError(
            f"{option} {out} is not empty and holds no {what} ({shown}); choose a new or empty folder"
        )


def check_creatable(out: Path, option: str = "--out") -> None:
    """A folder ``out`` can be made here (``/proc/…``, a read-only disk or a file in the way are refused
    in one line before any work): its first missing ancestor is created and removed again."""
    first = Path(os.path.abspath(out))
    while not first.parent.exists() and first.parent != first:
        first = first.parent
    if first.exists():
        return
    try:
        first.mkdir()
        first.rmdir()
    except OSError as e:
        raise OutputError(
            f"{option} {out} cannot be created ({e.strerror or e}); nothing was written"
        ) from None


def same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name the same file (through links and relative paths)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def refuse_inputs(out: Path, inputs: Sequence[tuple[str, Path]], option: str = "--out") -> None:
    """``out`` is none of ``inputs`` ((what, path) pairs), even with ``--overwrite``."""
    for what, path in inputs:
        if same_file(out, path):
            raise OutputError(
                f"{option} {out} is {what}; fedxrisk never overwrites an input, choose another path"
            )
