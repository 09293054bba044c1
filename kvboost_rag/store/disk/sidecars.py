"""Small JSON files beside the index that hold what it cannot lose: the store's manifest, each
document record, each model's key settings and name. With the chunk files (which hold their own rows)
they are enough to rebuild a damaged or deleted index (`recovery.py`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...plan.keys import Fingerprint
from ..entry import DocumentRecord
from ..format import write_atomically
from ..settings import SCHEMA_VERSION, KeySettings

MANIFEST_FILE = "store.json"


def write_manifest(root: Path, match_window: int) -> None:
    text = json.dumps({"schema_version": SCHEMA_VERSION, "match_window": match_window})
    write_atomically(root / MANIFEST_FILE, text.encode())


def read_manifest(root: Path) -> dict:
    try:
        return json.loads((root / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}


def write_sidecar(root: Path, kind: str, key: bytes, text: str) -> None:
    name = hashlib.sha256(key).hexdigest()
    write_atomically(root / kind / name[:2] / f"{name}.json", text.encode())


def read_sidecars(root: Path, kind: str) -> list[dict]:
    """Every readable sidecar of a kind; a damaged one is skipped."""
    found = []
    for path in sorted((root / kind).glob("*/*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return found


def document_json(record: DocumentRecord) -> str:
    return json.dumps(
        {
            "doc_key": record.doc_key.hex(),
            "fingerprint": record.fingerprint.hex(),
            "chunks": [chunk.hex() for chunk in record.chunks],
            "tokens": record.tokens,
        }
    )


def settings_json(model: Fingerprint, settings: KeySettings) -> str:
    return json.dumps({"model": model.hex(), "settings": settings.to_json()})


def names_json(fingerprint: Fingerprint, name: str) -> str:
    return json.dumps({"fingerprint": fingerprint.hex(), "name": name})
