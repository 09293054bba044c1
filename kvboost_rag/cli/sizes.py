"""Byte sizes on the command line: '2GiB', '500MB', '1048576'."""

from __future__ import annotations

import re

import typer

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)?\s*", text.lower())
    if match is None:
        raise typer.BadParameter(f"not a size: {text!r} (try 2GiB or 500MB)")
    return int(float(match[1]) * UNITS[match[2] or "b"])
