"""What document files hold: json records (jsonl or a json list, gzipped or not) and passages.

The CLI reads documents to warm with it and the eval reads NQ-Open with it, so a passage is put
in a prompt in the one form it was warmed in.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(slots=True, frozen=True)
class Passage:
    title: str
    text: str

    def as_document(self) -> str:
        """The exact text put in prompts and warmed: one form everywhere, so reuse finds it."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def read_records(path: str | os.PathLike[str]) -> list[Any]:
    """The records of a jsonl file or a json list, gzipped or not.

    A file that cannot be read as such (truncated or bad gzip, bytes that are not UTF-8, bad json)
    is a ValueError naming the path and, for json lines, the line: never a bare EOFError.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            raw = handle.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        reason = str(error) or type(error).__name__
        raise ValueError(f"{path}: not a whole gzip file, truncated or corrupt ({reason})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    if raw.lstrip().startswith("["):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: line {error.lineno}: bad json list ({error.msg})") from None
    records = []
    for number, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: line {number}: not json ({error.msg}, column {error.colno})") from None
    return records
