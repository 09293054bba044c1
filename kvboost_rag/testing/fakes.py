"""Stand-ins for the engine where the framework packages' own behaviour is under test, not the model."""

from __future__ import annotations

from typing import Any

from .. import environment
from ..engine import KVBoostRAG, WarmReport
from ..environment import ENVIRONMENT_OPTIONS, env_var


class CountingEngine(KVBoostRAG):
    """Warms nothing and loads no model: it counts the documents it is given."""

    def __init__(self) -> None:
        self.warmed: list[str] = []

    def warm(self, text: str, **kwargs: Any) -> WarmReport:  # type: ignore[override]
        self.warmed.append(text)
        return WarmReport(documents=1, chunks_stored=1)

    def warm_together(self, groups: Any, **kwargs: Any) -> WarmReport:
        texts = [text for group in groups for text in group]
        self.warmed += texts
        return WarmReport(documents=len(texts), chunks_stored=len(texts))


def record_engines(monkeypatch: Any) -> list[dict[str, Any]]:
    """`KVBoostRAG.from_pretrained` replaced by a recorder of its keyword arguments (no model
    loads), with this machine's KVBOOST_RAG_* variables cleared so they cannot leak in and no
    default engine kept from before (`environment.default_engine`)."""
    calls: list[dict[str, Any]] = []

    def from_pretrained(model: str | None = None, **kwargs: Any) -> str:
        calls.append({"model": model, **kwargs})
        return "engine"

    monkeypatch.setattr(KVBoostRAG, "from_pretrained", from_pretrained)
    monkeypatch.setattr(environment, "_DEFAULT_ENGINES", {})
    for option in ENVIRONMENT_OPTIONS:
        monkeypatch.delenv(env_var(option.name), raising=False)
    return calls


def record_groups(engine: KVBoostRAG, monkeypatch: Any) -> list[list[str]]:
    """The groups each `engine.warm_together` call is given (documents warmed among neighbours),
    recorded while the engine warms them as before."""
    groups: list[list[str]] = []
    warm_together = engine.warm_together

    def recording(given: Any, **kwargs: Any) -> WarmReport:
        groups.extend(list(group) for group in given)
        return warm_together(given, **kwargs)

    monkeypatch.setattr(engine, "warm_together", recording)
    return groups
