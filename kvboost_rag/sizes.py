"""Byte sizes as people write them: '2GiB', '500MB', '1048576'.

One parser for every front-end (command-line flags, the server's prune request), so a size that
works in one works in all; each front-end turns its ValueError into its own refusal.
"""

from __future__ import annotations

import re

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int:
    """Bytes in `text`: a number with an optional unit (decimal kB/MB/GB, binary KiB/MiB/GiB)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)?\s*", text.lower())
    if match is None:
        raise ValueError(f"not a size: {text!r} (try 2GiB or 500MB)")
    return int(float(match[1]) * UNITS[match[2] or "b"])
