"""Reading a model's files, with an error that says why one cannot be read: a file that exists but that this
process may not read (an image's model written by root with mode 0600, run as another user) is named as such, not
reported by a library as missing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stream.errors import UnrecoverableModelError


def unreadable(path: Path) -> str:
    """Why ``path``, which exists, cannot be read by this process: its owner and mode against this process's ids."""
    try:
        st = path.stat()
        owner = f"owner uid {st.st_uid} gid {st.st_gid}, mode {stat.filemode(st.st_mode)}"
    except OSError as exc:
        owner = f"cannot stat it: {exc.strerror}"
    return (f"model file {path} is not readable by this process (uid {os.getuid()} gid {os.getgid()}; {owner}): "
            "make it readable (chmod a+r), or run as its owner")


def read_model_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except PermissionError:
        raise UnrecoverableModelError(unreadable(path)) from None
