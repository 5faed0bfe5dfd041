"""Files written inside their folder, never through a link: the one way every run-folder writer writes.

A name in a run folder may have been replaced by a symbolic link (`ln -s /tmp/victim RUN/check.md` once had `report
check` overwrite its target), a FIFO (a writer would block on it) or a hard link to a file elsewhere. write_file
replaces the name whole; open_append refuses what is not a regular file of its own.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import IO

# What a writer opens: never through a link at the name (a `ln -s /tmp/victim RUN/check.md` once had `report check`
# overwrite its target), never blocking on a FIFO put there.
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC


def write_file(path: Path | str, data: bytes | str) -> Path:
    """Write `path` whole, never through a link: a temp file made beside it (O_EXCL, O_NOFOLLOW, in its directory by
    descriptor) is renamed over the name, which replaces a link or a file there rather than writing where it points;
    a crash leaves the old file or none, never half of one. Every writer of a run folder goes through here (or
    open_append). OSError as os.open raises it (a name that is a directory, a full disk)."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".{path.name[:100]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINK, 0o666, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(tmp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise
    except OSError as exc:
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # the name written, not the temp file's
    finally:
        os.close(parent)
    return path


def open_append(path: Path | str, binary: bool = False) -> IO:
    """`path` opened to append (created if absent), never through a link: O_NOFOLLOW refuses a symbolic link at the
    name, and a name that is not a regular file of one link (a FIFO, a device, a hard link to a file elsewhere) is
    refused too (OSError, as os.open raises it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | _NO_LINK, 0o666)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            raise OSError(f"{path}: not a regular file of its own (a link, a FIFO or a device): not written")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab" if binary else "a", **({} if binary else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise
