"""Which file a path names now: a store's index deleted or replaced under a running process is
told by its (device, inode), so the process reopens it instead of writing to a file no one sees."""

from __future__ import annotations

import os
from pathlib import Path


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file; None when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino
