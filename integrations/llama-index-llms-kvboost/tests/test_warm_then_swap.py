"""The deployment flow: `kvboost-rag warm` fills a store in another process, then an LLM built
from options alone finds it, with the passages in another order in its prompt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llama_index.llms.kvboost import KVBoostLLM

from kvboost_rag.eval.data import load_qa
from kvboost_rag.eval.prompt import rag_prompt

BOUNDARY_TOKENS = 4  # per passage: where its first and last tokens merge with the text around it


def warm_in_another_process(passages: list[str], root: Path) -> Path:
    """Each passage as a .txt file, warmed by the CLI into a fresh store under `root`."""
    documents, store = root / "documents", root / "store"
    documents.mkdir()
    for i, passage in enumerate(passages):
        (documents / f"{i}.txt").write_text(passage, encoding="utf-8")
    command = [sys.executable, "-m", "kvboost_rag.cli", "warm", str(documents), "--store", str(store)]
    done = subprocess.run([*command, "--dtype", "float32"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{len(passages)} warmed" in done.stdout
    return store


def test_a_store_warmed_by_the_cli_serves_a_fresh_llm(tmp_path: Path) -> None:
    passages = [example.passages[0].as_document() for example in load_qa(limit=3)]
    store = warm_in_another_process(passages, tmp_path)

    llm = KVBoostLLM(store=str(store), dtype="float32", max_tokens=4)  # options only: no engine=
    prompt = rag_prompt("Which is oldest?", passages[::-1], chat=False)
    raw = llm.complete(prompt).raw

    tokenizer = llm.get_engine().tokenizer
    passage_tokens = sum(len(tokenizer(p, add_special_tokens=False).input_ids) for p in passages)
    slack = BOUNDARY_TOKENS * len(passages)
    usage = raw["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= passage_tokens - slack
    assert raw["reused_approximate_tokens"] >= passage_tokens - slack  # moved: found where they landed
    assert raw["computed_tokens"] <= usage["prompt_tokens"] - passage_tokens + slack  # only the rest computed
