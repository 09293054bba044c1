"""Writers' claims on the documents they encode: who holds one, and whether that writer is gone.

A claim names its writer by host, process and call (`claimant`), so a writer on the same host can
tell that the holder's process has ended (killed mid-warm) and take the claim at once instead of
waiting for it to lapse; a holder on another host is trusted until its claim lapses.
"""

from __future__ import annotations

import os
import socket
import uuid


def claimant() -> str:
    """A new writer's name: this host, this process, and one call of it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def holder_gone(holder: str) -> bool:
    """Whether a claim's holder was a process of this host that has ended."""
    parts = holder.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False
