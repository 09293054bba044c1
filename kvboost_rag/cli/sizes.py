"""Byte sizes on the command line: '2GiB', '500MB', '1048576' (`kvboost_rag.sizes`), refused as a
usage error."""

from __future__ import annotations

import typer

from ..sizes import parse_size


def parse_bytes(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
