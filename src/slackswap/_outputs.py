"""Output files: every write goes through a temporary file and a rename, and the outputs of one
command are written together or not at all (``outputs_together``).

Rules (docs/limitations.md, Outputs): a symlink is written through (its target is replaced, the
link stays); a FIFO, a device, a socket and any path under /dev or /proc are refused, as is a path
ending in '/', a name longer than the file system allows and a directory. Temporary files have short names, so any name the
file system accepts can be written.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import OutputPathError

_STAGED: contextvars.ContextVar[list | None] = contextvars.ContextVar("slackswap_staged_outputs", default=None)


def _fail(path, reason: str, fix: str = "give a file path in an existing, writable directory") -> OutputPathError:
    return OutputPathError(f"cannot write {str(path)!r}: {reason}: {fix}")


def output_target(path: str | os.PathLike) -> Path:
    """The regular file that writing ``path`` replaces (a symlink's target), or OutputPathError."""
    text = os.fspath(path)
    if not text:
        raise _fail(path, "the path is empty")
    if text.endswith(("/", os.sep)):
        raise _fail(path, "the path ends in '/'", "name a file inside the directory (create the directory first)")
    if any(os.path.abspath(p).startswith(("/dev/", "/proc/")) for p in (text, os.path.realpath(text))):
        # /dev/stdout resolves to /proc/self/fd/1 and then to whatever stdout is: never replace that.
        raise _fail(path, "it is under /dev or /proc", "give a path to a regular file; to see the output, "
                    "write a file and print it")
    try:
        target = Path(os.path.realpath(text)) if os.path.islink(text) else Path(text)
        parent = target.parent if str(target.parent) else Path(".")
        name_max = os.pathconf(parent, "PC_NAME_MAX") if parent.is_dir() else 255
        if len(os.fsencode(target.name)) > name_max:
            raise _fail(path, f"the file name is {len(os.fsencode(target.name))} bytes, over the file system's "
                        f"limit of {name_max}", "use a shorter name")
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OutputPathError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _fail(path, "the path is too long for the file system", "use a shorter path") from None
        raise _fail(path, exc.strerror or type(exc).__name__) from None
    if stat.S_ISDIR(mode):
        raise _fail(path, "it is a directory", "give a file path inside it")
    if not stat.S_ISREG(mode):
        raise _fail(path, "it is not a regular file (a FIFO, a device or a socket)",
                    "give a path to a regular file; slackswap does not write to special files")
    return target


def _stage(path, data: bytes) -> tuple[str, Path]:
    """Write ``data`` to a temporary file beside the target; return (temporary path, target)."""
    target = output_target(path)
    directory = target.parent if str(target.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".slackswap-", suffix=".tmp", dir=directory)
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(tmp, _mode_for(target))
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        staged, tmp = (tmp, target), None
        return staged
    except OSError as exc:
        raise _fail(path, exc.strerror or exc.__class__.__name__) from None
    finally:
        _remove(tmp)


def _remove(tmp: str | None) -> None:
    if tmp is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename. Inside ``outputs_together``
    the rename waits for the block to end. A failure leaves no temporary file and an existing
    ``path`` as it was; it is raised as OutputPathError (one line, naming the path)."""
    staged = _stage(path, data)
    batch = _STAGED.get()
    if batch is not None:
        batch.append(staged)
        return
    _commit([staged])


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def _commit(staged: list[tuple[str, Path]]) -> None:
    for i, (tmp, target) in enumerate(staged):
        try:
            os.replace(tmp, target)
        except OSError as exc:
            for rest, _ in staged[i:]:
                _remove(rest)
            raise _fail(target, exc.strerror or exc.__class__.__name__) from None


@contextlib.contextmanager
def outputs_together() -> Iterator[None]:
    """Every file written inside the block is renamed into place when the block ends without an
    exception; on an exception none is (their temporary files are removed)."""
    staged: list[tuple[str, Path]] = []
    token = _STAGED.set(staged)
    try:
        yield
    except BaseException:
        for tmp, target in staged:
            if target is not None:
                _remove(tmp)
        for directory, target in staged:
            if target is None:  # a directory this block created: empty again now, deepest first
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        raise
    finally:
        _STAGED.reset(token)
    _commit([entry for entry in staged if entry[1] is not None])


def make_output_directory(path: str | os.PathLike) -> Path:
    """Create directory ``path`` (and missing parents); inside ``outputs_together`` the directories
    created are removed again if the block fails, so a failed command leaves no empty directory."""
    directory = Path(path)
    missing = []
    probe = directory
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create directory {str(path)!r}: {exc.strerror or exc}") from None
    batch = _STAGED.get()
    if batch is not None:
        batch.extend((str(d), None) for d in missing)  # deepest first, the order to remove them in
    return directory


def _mode_for(target: Path) -> int:
    """An existing file keeps its permission bits; a new one gets 0666 less the umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask
