"""Odd input is a clear TypeError or ValueError naming the argument, raised before any model
work and leaving nothing behind; the warm command reports a bad file by name and line and goes on."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvboost_rag import EngineConfig, KVBoostRAG, SamplingParams
from kvboost_rag.cli import app
from kvboost_rag.records import read_records
from kvboost_rag.store.disk import DiskStore

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture()
def no_model_work(fresh_engine: KVBoostRAG) -> Iterator[KVBoostRAG]:
    """The engine, with every module of its model counting the calls it gets: none may run."""
    calls: list[str] = []
    hooks = [
        module.register_forward_pre_hook(lambda m, args, name=name: calls.append(name))
        for name, module in fresh_engine.model.named_modules()
    ]
    try:
        yield fresh_engine
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [], f"the model ran: {calls[:3]}"
    assert fresh_engine.store.stats().entries == 0, "nothing stored"


# prompts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prompt", "error", "message"),
    [
        (None, TypeError, "prompt must be a str or a list of chat messages, got NoneType"),
        (b"bytes", TypeError, "prompt must be .* got bytes"),
        ({"role": "user", "content": "hi"}, TypeError, "prompt must be .* got dict"),  # not its keys
        ([{"role": "user", "content": None}], TypeError, r"messages\[0\]\.content must be a str, got NoneType"),
        ([*CHAT, {"role": "user", "content": 7}], TypeError, r"messages\[1\]\.content must be a str, got int"),
        ([{"role": None, "content": "hi"}], TypeError, r"messages\[0\]\.role must be a str"),
        (["hi"], TypeError, r"messages\[0\] must be a dict"),
        ([{"role": "user"}], ValueError, r"messages\[0\] lacks 'content'"),
        ("ab\ud800c", ValueError, "prompt is not valid Unicode.* position 2"),
        ([{"role": "user", "content": "\udfff"}], ValueError, r"messages\[0\]\.content is not valid.* position 0"),
    ],
)
def test_bad_prompts_are_refused_before_any_model_work(
    no_model_work: KVBoostRAG, prompt: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        no_model_work.stream(prompt)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        no_model_work.plan(prompt)  # type: ignore[arg-type]


def test_a_role_the_template_accepts_is_fine(no_model_work: KVBoostRAG) -> None:
    assert len(no_model_work.tokenize_prompt([{"role": "wizard", "content": "hi"}])) > 0


# documents --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("documents", "error", "message"),
    [
        ({"text": "Paris is the capital of France."}, TypeError, "documents must be .* got dict"),
        (b"Paris is the capital of France.", TypeError, "documents must be .* got bytes .*decode"),
        (None, TypeError, "documents must be .* got NoneType"),
        (42, TypeError, "documents must be .* got int"),
        (["fine text", {"text": "x"}], TypeError, r"documents\[1\]\) is a dict, expected str"),
        (["fine text", b"x"], TypeError, r"documents\[1\]\) is a bytes"),
        (["fine text", None], TypeError, r"documents\[1\]\) is a NoneType"),
        (["fine text", "caf\ud800"], ValueError, r"documents\[1\]\) is not valid Unicode.* position 3"),
        (["fine text", ""], ValueError, r"document 1 is empty: documents\[1\] gives no tokens"),
    ],
)
def test_bad_documents_are_refused_before_any_model_work(
    no_model_work: KVBoostRAG, documents: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        no_model_work.warm(documents)  # type: ignore[arg-type]


# sampling ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"temperature": float("inf")}, ValueError, "temperature must be finite"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": -0.5}, ValueError, "temperature"),
        ({"temperature": "0.7"}, TypeError, "temperature must be a number"),
        ({"top_p": 0.0}, ValueError, "top_p"),
        ({"top_p": 1.01}, ValueError, "top_p"),
        ({"top_p": float("nan")}, ValueError, "top_p"),
        ({"top_k": True}, TypeError, "top_k must be an integer, got bool"),
        ({"top_k": -1}, ValueError, "top_k"),
        ({"top_k": 2.0}, TypeError, "top_k"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an integer, got bool"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"seed": "42"}, TypeError, "seed must be an integer or None, got str"),
        ({"seed": 2**64}, ValueError, "seed"),
        ({"stop": ""}, ValueError, "stop is an empty string"),
        ({"stop": ["end", ""]}, ValueError, r"stop\[1\] is an empty string"),
        ({"stop": ["end", 3]}, TypeError, r"stop\[1\] must be a str, got int"),
        ({"stop": 3}, TypeError, "stop must be a str or a list of str"),
        ({"timeout_s": "1"}, TypeError, "timeout_s"),
    ],
)
def test_bad_sampling_settings_are_refused_before_any_model_work(
    no_model_work: KVBoostRAG, kwargs: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        no_model_work.stream(CHAT, **kwargs)


def test_sampling_params_normalize_what_they_accept() -> None:
    assert SamplingParams(stop="Paris").stop == ["Paris"], "one stop string, not its characters"
    assert SamplingParams(stop=None).stop == [] and SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(temperature=1, seed=-1).temperature == 1.0


def test_sampling_is_a_sampling_params_or_its_fields_not_both(no_model_work: KVBoostRAG) -> None:
    with pytest.raises(TypeError, match="give sampling= or max_new_tokens, seed, not both"):
        no_model_work.stream(CHAT, sampling=SamplingParams(max_new_tokens=3), max_new_tokens=3, seed=1)
    with pytest.raises(TypeError, match="sampling must be a SamplingParams, got dict"):
        no_model_work.stream(CHAT, sampling={"max_new_tokens": 3})  # type: ignore[arg-type]


def test_a_sampling_params_samples_as_its_fields_do(fresh_engine: KVBoostRAG) -> None:
    fields = dict(max_new_tokens=4, temperature=0.9, top_k=20, seed=7)
    given = fresh_engine.generate(CHAT, sampling=SamplingParams(**fields), store_prompt=False)  # type: ignore[arg-type]
    assert given.token_ids == fresh_engine.generate(CHAT, **fields, store_prompt=False).token_ids  # type: ignore[arg-type]
    assert 0 < len(given.token_ids) <= 4


@pytest.mark.parametrize(
    ("store", "message"),
    [("redis://a:1/0,redis://b:1/0", "at most one"), ("/a,/b", "at most one"), ("ftp://x/y", "neither a directory")],
)
def test_a_bad_store_is_refused_before_the_model_loads(no_model_work: KVBoostRAG, store: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVBoostRAG.from_pretrained("/nowhere/model", store=store)  # a missing model would be another error
    with pytest.raises(ValueError, match=message):
        KVBoostRAG(no_model_work.model, no_model_work.tokenizer, EngineConfig(store=store), store=no_model_work.store)


# files ------------------------------------------------------------------------------------
def test_read_records_names_the_file_and_line(tmp_path: Path) -> None:
    whole = gzip.compress(b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(200)))
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="cut.jsonl.gz: not a whole gzip file"):
        read_records(truncated)
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="plain.jsonl.gz: not a whole gzip file"):
        read_records(not_gzip)
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"text": "x"}\n\n{"text": \n')
    with pytest.raises(ValueError, match="bad.jsonl: line 3: not json"):
        read_records(bad_line)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.jsonl: not UTF-8"):
        read_records(latin1)


def _corpus(folder: Path, passages: list[str]) -> Path:
    """Two good files and, between them in sorted order, one of every kind of bad one."""
    folder.mkdir()
    (folder / "a_good.txt").write_text(passages[0])
    (folder / "b_bad_json.jsonl").write_text(json.dumps({"text": passages[1]}) + "\n{oops\n")
    whole = gzip.compress("\n".join(json.dumps({"text": p}) for p in passages[:20]).encode())
    (folder / "c_cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (folder / "d_odd_record.jsonl").write_text(json.dumps({"text": passages[2]}) + "\n" + json.dumps({"q": 1}))
    (folder / "e_latin1.txt").write_bytes("café au lait".encode("latin-1"))
    (folder / "f_surrogate.jsonl").write_text('"fine"\n"bad \\ud800 text"\n')
    too_long = "word " * 3000  # over the tiny model's 2048 positions
    (folder / "g_long.jsonl").write_text("\n".join(json.dumps(t) for t in [passages[3], too_long, passages[4]]))
    return folder


def _warm(folder: Path, store: Path, model: Path, *options: str):  # noqa: ANN202 - click's Result
    args = ["warm", str(folder), "--store", str(store), "--model", str(model), "--dtype", "float32", *options]
    return CliRunner().invoke(app, args)


def test_warm_cli_reports_bad_files_and_warms_the_rest(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    result = _warm(_corpus(tmp_path / "docs", passages), store, tiny_model_dir)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    expected = [
        "b_bad_json.jsonl: line 2: not json",
        "c_cut.jsonl.gz: not a whole gzip file",
        "d_odd_record.jsonl: record 1 is neither text",
        "e_latin1.txt: not UTF-8",
        "f_surrogate.jsonl: record 1 is not valid Unicode",
        "g_long.jsonl: record 1: skipped: document 0 (documents[0]) has",  # the engine's words
    ]
    assert len(errors) == len(expected), result.stderr
    for line, fragment in zip(errors, expected):
        assert fragment in line, line
    assert "6 files failed" in result.stderr
    assert "Traceback" not in result.output and "Aborted" not in result.output
    assert "4 documents from 7 files: 3 warmed" in result.stdout and ", 1 failed" in result.stdout
    assert DiskStore(store, 16).stats()[0].documents == 3, "a_good.txt and g_long.jsonl's other two"
    stats = CliRunner().invoke(app, ["cache", "stats", "--store", str(store)])
    assert stats.exit_code == 0 and str(tiny_model_dir) in stats.stdout, "the model named, not only its fingerprint"


def test_warm_cli_fail_fast_stops_at_the_first_bad_file(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    result = _warm(_corpus(tmp_path / "docs", passages), store, tiny_model_dir, "--fail-fast")
    assert result.exit_code == 1, result.output
    assert result.stderr.count("error:") == 1 and "b_bad_json.jsonl: line 2" in result.stderr
    assert "1 file failed" in result.stderr and "Traceback" not in result.output
    assert not (store / "kv").exists() or DiskStore(store, 16).stats() == [], "stopped before warming"


def test_warm_cli_warms_documents_among_their_nearest_by_default(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    from transformers import AutoTokenizer

    from kvboost_rag import EngineConfig
    from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, embed, groups_among, nearest_others
    from kvboost_rag.plan.keys import content_hash

    documents = passages[:6]
    nearest = {d: [documents[j] for j in others] for d, others in zip(documents, nearest_others(embed(documents), 4))}
    groups = groups_among(documents, nearest.__getitem__)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in documents))

    def contexts(store: Path) -> dict[str, int]:
        """Each document's recorded context tokens (its first chunk's, equal to where it was stored)."""
        engine = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", config=EngineConfig(store=str(store)))
        found = {}
        for document in documents:
            ids = np.asarray(engine.tokenizer(document, add_special_tokens=False).input_ids, np.int64)
            entry = engine.store.get_content(content_hash(engine.keys.document, ids[: engine.boundaries(ids)[1]]))
            assert entry is not None and entry.base_position == entry.warmed_after.context_tokens
            found[document] = entry.warmed_after.context_tokens
        engine.store.close()
        return found

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    store = tmp_path / "store"
    result = _warm(folder, store, tiny_model_dir)
    assert result.exit_code == 0, result.output
    assert "6 warmed" in result.stdout and f"each document's {DEFAULT_NEIGHBOURS} nearest" in result.stderr
    assert any(len(g) > 1 for g in groups)
    together = contexts(store)
    for group in groups:  # each member after half its group or more; a group of one alone
        assert all((together[d] > 0) == (len(group) > 1) for d in group), group
    each = tmp_path / "each"
    assert _warm(folder, each, tiny_model_dir, "--no-together").exit_code == 0
    separator = tokens("\n\n")
    assert contexts(each) == {d: sum(tokens(n) + separator for n in nearest[d]) for d in documents}, "after its own"
    alone = tmp_path / "alone"
    assert _warm(folder, alone, tiny_model_dir, "--neighbours", "0").exit_code == 0
    assert set(contexts(alone).values()) == {0}, "--neighbours 0: each alone"
    grown = tmp_path / "grown"  # a corpus warmed as it grows: the new documents among everything
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in documents[:4]))
    assert _warm(folder, grown, tiny_model_dir).exit_code == 0
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in documents))
    again = _warm(folder, grown, tiny_model_dir)
    assert again.exit_code == 0 and "2 warmed" in again.stdout and "4 already warm" in again.stdout
    later = contexts(grown)
    for document in documents[4:]:  # after the warm members of its group, or its group's other new one
        group = next(g for g in groups if document in g)
        assert (later[document] > 0) == (len(group) > 1), group
    refused = _warm(folder, store, tiny_model_dir, "--neighbours", "-1")
    assert refused.exit_code == 2 and "Traceback" not in refused.output
