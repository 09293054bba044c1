"""The README's examples run as written: its Python code blocks, with the session's engine (the
embedded default model, a memory store) in place of `from_pretrained()`'s user-cache store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvboost_rag import EngineConfig, KVBoostRAG

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_python_api_example_runs_and_reuses_the_documents_it_warmed(
    engine: KVBoostRAG, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    block = python_blocks()[0]
    assert "KVBoostRAG.from_pretrained()" in block and "engine.warm(" in block
    own = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store="memory"), name=engine.name)
    monkeypatch.setattr(KVBoostRAG, "from_pretrained", classmethod(lambda cls, *args, **kwargs: own))
    exec(compile(block, f"{README}:python block 1", "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("reused tokens: ") and int(printed[-1].split()[-1]) > 0, (
        "the streamed answer reused the warmed documents' KV"
    )
