"""How a store was written, and an engine opened on it: adopt the store's settings or say why not.

Chunk keys depend on the model and on how documents were cut, encoded and kept (`KeySettings`);
the window index depends on the match window. An engine whose settings differ from the store's
would find nothing there, silently. So a store records both, and an engine adopts the recorded
value of every setting it left at its default, and fails with an error naming the difference
for a setting it chose otherwise.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ..config import EngineConfig

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2


class StoreSettingsError(ValueError):
    """The engine was asked for settings other than those the store was written with."""


@dataclass(slots=True, frozen=True)
class KeySettings:
    """The settings that shape a document's chunk keys (besides the model)."""

    chunking: str
    chunk_size: int
    adaptive_slack: int
    kv_quantization: str | None
    warm_prefix: str

    @classmethod
    def of(cls, config: EngineConfig) -> KeySettings:
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KeySettings:
        return cls(**json.loads(text))

    def differences(self, other: KeySettings) -> dict[str, tuple[Any, Any]]:
        return {
            f.name: (getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        }


def reconcile(
    config: EngineConfig, recorded: list[KeySettings], store_window: int | None, store_name: str
) -> EngineConfig:
    """The config to run with on a store written with `recorded` key settings and `store_window`."""
    explicit = config.explicit_fields()
    if store_window is not None and store_window != config.match_window:
        if "match_window" in explicit:
            raise StoreSettingsError(
                f"store {store_name} indexes windows of {store_window} tokens; the engine asks for "
                f"match_window={config.match_window}. Use match_window={store_window} or another store."
            )
        log.warning(
            "kvboost-rag: store %s indexes windows of %d tokens: this engine adopts match_window=%d",
            store_name,
            store_window,
            store_window,
        )
        config = replace(config, match_window=store_window)
    wanted = KeySettings.of(config)
    if not recorded or wanted in recorded:
        return config
    adoptable = [r for r in recorded if all(name not in explicit for name in wanted.differences(r))]
    if len(adoptable) == 1:
        adopted = ", ".join(f"{name}={stored!r}" for name, (_, stored) in wanted.differences(adoptable[0]).items())
        log.warning(
            "kvboost-rag: store %s was written with %s: this engine adopts them (pass them, or use another "
            "store, to choose otherwise)",
            store_name,
            adopted,
        )
        return replace(config, **asdict(adoptable[0]))
    described = "; ".join(
        ", ".join(f"{name}={stored!r}" for name, (_, stored) in wanted.differences(r).items()) for r in recorded
    )
    raise StoreSettingsError(
        f"store {store_name} holds documents of this model written with other settings ({described}); "
        f"the engine asks for {', '.join(f'{n}={v!r}' for n, v in asdict(wanted).items())}. "
        "Pass the store's settings, or use another store, so that warmed documents are found."
    )
