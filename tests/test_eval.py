"""The NQ-style eval: data loading, statistics, a small end-to-end run, the CLI."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from kvboost_lab.eval_cli import app as lab_app
from kvboost_lab.variants import RESEARCH_VARIANTS, rho_variants
from kvboost_rag import KVBoostRAG
from kvboost_rag.cli import app
from kvboost_rag.config import ExactnessConfig, RepairConfig
from kvboost_rag.eval.data import load_qa
from kvboost_rag.eval.report import format_table, write
from kvboost_rag.eval.runner import paired_ci, run_eval
from kvboost_rag.eval.variants import VARIANTS, Baseline, Variant, variants
from kvboost_rag.ops.logits import kl_divergence as first_token_kl
from kvboost_rag.ops.logits import top_margin

RECORDS = [
    {
        "question": "who wrote hamlet",
        "answers": ["William Shakespeare", "Shakespeare"],
        "ctxs": [
            {"title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare around 1600."},
            {"title": "Macbeth", "text": "Macbeth is a tragedy by William Shakespeare, first performed in 1606."},
        ],
    },
    {
        "question": "what is the capital of france",
        "answers": ["Paris"],
        "ctxs": [
            {"title": "France", "text": "France is a country in Western Europe. Its capital is Paris."},
            {"title": "Lyon", "text": "Lyon is the third-largest city of France, on the Rhone and the Saone."},
        ],
    },
]


@pytest.mark.parametrize("shape", ["jsonl", "json", "jsonl.gz", "json.gz"])
def test_load_qa_reads_every_shape(tmp_path: Path, shape: str) -> None:
    text = json.dumps(RECORDS) if shape.startswith("json.") or shape == "json" else "\n".join(map(json.dumps, RECORDS))
    path = tmp_path / f"data.{shape}"
    if shape.endswith(".gz"):
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    examples = load_qa(path)
    assert [e.question for e in examples] == ["who wrote hamlet", "what is the capital of france"]
    assert examples[0].answers == ("William Shakespeare", "Shakespeare")
    assert (
        examples[1].passages[0].as_document() == "France\nFrance is a country in Western Europe. Its capital is Paris."
    )


def test_load_qa_names_the_bad_record(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({"answers": ["x"]}) + "\n")
    with pytest.raises(ValueError, match="record 1"):
        load_qa(path)


def test_shipped_nq_copy_loads() -> None:
    examples = load_qa()
    assert len(examples) == 2655 and all(len(e.passages) == 1 for e in examples[:50])


def test_paired_interval_and_kl() -> None:
    low, high = paired_ci([1.0, 0.0, 1.0, 0.0])
    assert low == pytest.approx(0.5 - 1.96 * (1 / 3) ** 0.5 / 2) and high == pytest.approx(
        0.5 + 1.96 * (1 / 3) ** 0.5 / 2
    )
    logits = torch.tensor([2.0, 1.0, 0.0])
    assert first_token_kl(logits, logits) == pytest.approx(0.0, abs=1e-7)
    assert first_token_kl(logits, torch.tensor([0.0, 1.0, 2.0])) > 0.5
    assert top_margin(torch.log(torch.tensor([0.1, 0.6, 0.3]))) == pytest.approx(0.3)


def test_small_eval_end_to_end(fresh_engine: KVBoostRAG, tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(map(json.dumps, RECORDS)))
    examples = load_qa(path)
    chosen = variants(RESEARCH_VARIANTS, Baseline(RepairConfig(), ExactnessConfig()), RESEARCH_VARIANTS)
    report = run_eval(
        fresh_engine,
        examples,
        lambda i: [p.as_document() for p in examples[i].passages],
        [v for v in chosen if v.name != "prefix"],
        sweep=[Variant("cacheblend@1", "reuse", RepairConfig(rho=1.0), ExactnessConfig.off())],
        sweep_questions=1,
        max_new_tokens=12,
    )
    summary = report.summary()
    assert set(summary) == set(RESEARCH_VARIANTS) - {"prefix"} | {"cacheblend@1"}
    for record in report.records["verify"] + report.records["default"]:
        # a verified first token is full prefill's, logits and all
        assert record.exact_from != 0 or (record.first_token_agrees and record.first_token_kl == 0.0)
    for record in report.records["exact"] + report.records["refresh"]:
        # refreshed after the first token: full prefill's answer whenever the first token is
        assert record.exact_from in (0, 1, None) and (record.answer_agrees or not record.first_token_agrees)
        assert record.new_tokens < 2 or record.recomputed_share > 1.0, "a refresh recomputes the whole prompt"
    for record in report.records["default"]:
        assert record.exact_from in (0, None), "the default checks the first token only"
    assert summary["refresh"]["recomputed_answer_share"] > 0
    for name, stats in summary.items():
        assert stats["total_median_s"] >= stats["ttft_median_s"] > 0
        assert not stats["second_token_median_s"] < stats["ttft_median_s"], name  # NaN: one-token answers
        assert 0.0 <= stats["recomputed_share"] and stats["prompt_tokens_median"] > 0
    assert summary["full"]["recomputed_share"] == 0.0
    assert summary["none"]["recomputed_share"] == 0.0 and summary["cacheblend"]["recomputed_share"] > 0
    verified = [r.exact_from == 0 for r in report.records["default"]]
    assert summary["default"]["verified_first_token_share"] == sum(verified) / len(verified)
    assert summary["cacheblend"]["recomputed_answer_share"] == 0.0, "CacheBlend alone never recomputes"
    assert summary["full"]["first_token_agreement"] == 1.0 and summary["full"]["first_token_kl_mean"] == 0.0
    assert summary["cacheblend@1"]["questions"] == 1
    assert summary["cacheblend@1"]["first_token_kl_mean"] < 1e-3, "rho = 1 is full prefill"
    clear = [r.reference_margin >= 0.2 for r in report.records["none"]]
    assert summary["none"]["clear_share"] == sum(clear) / len(clear)
    assert all(0 < s["reuse_share"] for name, s in summary.items() if name != "full")
    paths = write(report, tmp_path / "out", "eval")
    assert json.loads(paths["json"].read_text())["summary"]["none"]["questions"] == 2
    assert "| cacheblend |" in paths["markdown"].read_text()
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"
    assert "boundary" in format_table(report)


def test_full_prefill_alone_warms_nothing(fresh_engine: KVBoostRAG, tmp_path: Path) -> None:
    """A run of full prefill only (comparing weight formats) reads no warm KV: it writes none."""
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(map(json.dumps, RECORDS)))
    examples = load_qa(path)
    report = run_eval(
        fresh_engine,
        examples,
        lambda i: [p.as_document() for p in examples[i].passages],
        [Variant("full", "full")],
        max_new_tokens=2,
    )
    assert len(report.records["full"]) == 2
    assert fresh_engine.store.stats().entries == 0


def test_first_variant_must_be_full(fresh_engine: KVBoostRAG) -> None:
    with pytest.raises(ValueError, match="full prefill"):
        run_eval(fresh_engine, [], lambda i: [], [Variant("none", "reuse", RepairConfig(strategy="none"))])


def test_lab_eval_runs_research_variants_on_a_small_file(tmp_path: Path) -> None:
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    result = CliRunner().invoke(
        lab_app,
        [
            "eval",
            "--data",
            str(path),
            "--limit",
            "2",
            "--use-ctxs",
            "--k",
            "2",
            "--variants",
            "full,none,cacheblend",
            "--rho-sweep",
            "",
            "--max-new-tokens",
            "4",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "cacheblend" in result.output
    assert (tmp_path / "out" / "eval_k2_n2.md").is_file()


def test_cli_eval_takes_the_products_variants_and_the_engines_options(tmp_path: Path) -> None:
    """`kvboost-rag eval`: full, default, plain and the option table's engine flags; the research
    variants are the lab's (`kvboost-lab eval`), named in the refusal."""
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    common = ["eval", "--data", str(path), "--limit", "2", "--use-ctxs", "--k", "2", "--max-new-tokens", "2"]
    out = tmp_path / "out"
    arguments = [*common, "--repair", "cacheblend:0.3", "--verify-margin", "0", "--chunk-size", "64", "--out", str(out)]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "eval_k2_n2.json").read_text())
    assert set(report["summary"]) == {"full", "default", "plain"}
    assert "rho=0.3" in report["settings"]["repair"] and "verify_margin=0" in report["settings"]["exactness"]
    refused = CliRunner().invoke(app, [*common, "--variants", "full,cacheblend"])
    assert refused.exit_code == 2 and "cacheblend" in refused.output and "Traceback" not in refused.output
    for research in ("--rho-sweep", "--others-from", "--check-layer"):
        assert CliRunner().invoke(app, [*common, research, "1"]).exit_code == 2, research


def test_cli_eval_warms_as_the_cli_does_and_can_mix_in_random_passages(tmp_path: Path) -> None:
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    common = ["eval", "--data", str(path), "--limit", "2", "--k", "2", "--rho-sweep", "", "--max-new-tokens", "2"]
    for extra, stem in [([], "eval_k2_n2"), (["--random-others"], "eval_k2_n2_random")]:
        out = tmp_path / stem
        variants = "full,default,plain,nearest"
        result = CliRunner().invoke(lab_app, [*common, "--variants", variants, "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        report = json.loads((out / f"{stem}.json").read_text())
        assert report["settings"]["warm_neighbours"] == 4, "as kvboost-rag warm warms"
        assert report["settings"]["warming"] == "groups"
        assert report["settings"]["random_others"] == (extra == ["--random-others"])
        assert set(report["summary"]) == set(variants.split(",")) and "retention" in report["summary"]["plain"]


OTHER_CORPUS = [
    {"question": "", "answers": [], "ctxs": [{"title": "Python reference: assert", "text": text}]}
    for text in (
        "Assert statements are a convenient way to insert debugging assertions into a program.",
        "The pass statement is a null operation; when it is executed, nothing happens.",
    )
]


def test_cli_eval_mixes_documents_from_a_second_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvboost_rag.eval.retrieval as retrieval

    prompts: list[list[str]] = []
    mix = retrieval.two_corpora_documents

    def recorded(*args: Any, **kwargs: Any) -> list[list[str]]:
        prompts.extend(mix(*args, **kwargs))
        return prompts

    monkeypatch.setattr(retrieval, "two_corpora_documents", recorded)
    path, other = tmp_path / "qa.json", tmp_path / "python.json"
    path.write_text(json.dumps(RECORDS))
    other.write_text(json.dumps(OTHER_CORPUS))
    out = tmp_path / "out"
    arguments = ["eval", "--data", str(path), "--limit", "2", "--k", "2", "--rho-sweep", "", "--max-new-tokens", "2"]
    arguments += ["--variants", "full,default,plain", "--others-from", str(other), "--out", str(out)]
    result = CliRunner().invoke(lab_app, arguments)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "eval_k2_n2_two_corpora.json").read_text())
    assert report["settings"]["others_from"] == "python.json" and report["settings"]["warming"] == "groups"
    assert set(report["summary"]) == {"full", "default", "plain"}
    assert len(prompts) == 2 and all(len(p) == 2 for p in prompts)
    assert all(p[0] in {c["title"] + "\n" + c["text"] for r in RECORDS for c in r["ctxs"]} for p in prompts)
    assert all(p[1].startswith("Python reference: assert\n") for p in prompts), "the second from the other corpus"


def test_cli_eval_refuses_a_second_corpus_with_given_or_random_documents_or_without_passages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvboost_rag.options

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("no engine for a refused combination")

    monkeypatch.setattr(kvboost_rag.options, "build_engine", never)
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    for extra in ("--use-ctxs", "--random-others"):
        result = CliRunner().invoke(lab_app, ["eval", "--data", str(path), "--others-from", str(path), extra])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "--others-from" in result.output and extra in result.output
    empty = tmp_path / "questions-only.json"
    empty.write_text(json.dumps([{"question": "q", "answers": ["a"]}]))
    result = CliRunner().invoke(lab_app, ["eval", "--data", str(path), "--others-from", str(empty)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "holds no passages" in result.output


def test_cli_eval_refuses_unknown_variants(tmp_path: Path) -> None:
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    result = CliRunner().invoke(app, ["eval", "--data", str(path), "--use-ctxs", "--variants", "full,magic"])
    assert result.exit_code != 0 and "magic" in result.output


@pytest.mark.parametrize(("command", "registry"), [(app, VARIANTS), (lab_app, RESEARCH_VARIANTS)])
def test_cli_eval_help_lists_every_variant_with_what_it_runs(command: typer.Typer, registry: dict) -> None:
    result = CliRunner().invoke(command, ["eval", "--help"], env={"COLUMNS": "100"}, terminal_width=100)
    assert result.exit_code == 0, result.output
    listed = result.output[result.output.index("Variants (--variants):") :].splitlines()
    for name, builder in registry.items():
        assert any(line.split()[:1] == [name] and builder.about.split()[0] in line for line in listed), name
    assert len([line for line in listed if line.split()[:1] and line.split()[0] in registry]) == len(registry)
    assert "eval/variants.py" not in result.output and "full,default,plain" in result.output


def test_cli_eval_refuses_a_missing_data_file_before_loading_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvboost_rag.options

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("no engine for a missing file")

    monkeypatch.setattr(kvboost_rag.options, "build_engine", never)
    result = CliRunner().invoke(app, ["eval", "--data", "/nonexistent/qa.jsonl"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "--data" in result.output and "does not exist" in result.output


def test_prompts_over_the_context_window_leave_out_the_lowest_ranked(
    fresh_engine: KVBoostRAG, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--k 20` on a small window: the best-ranked documents that fit are kept, in rank order."""
    from kvboost_rag.eval.prompt import TEMPLATE, rag_prompt
    from kvboost_rag.eval.runner import fitting_documents

    documents = [f"Document {i}\n" + "word " * 60 for i in range(6)]
    question = "which document is first"
    two = len(fresh_engine.tokenize_prompt(rag_prompt(question, documents[:2], TEMPLATE, True)))
    monkeypatch.setattr(fresh_engine, "max_context", two + 8)
    assert fitting_documents(fresh_engine, question, documents, TEMPLATE, True, 8) == documents[:2]
    assert fitting_documents(fresh_engine, question, documents, TEMPLATE, True, 9) == documents[:1]
    monkeypatch.setattr(fresh_engine, "max_context", 10)
    with pytest.raises(ValueError, match="context window"):
        fitting_documents(fresh_engine, question, documents, TEMPLATE, True, 8)


@pytest.mark.parametrize(
    ("command", "option"),
    [(app, ["--verify-margin", "2"]), (app, ["--verify-tokens", "-1"]), (lab_app, ["--doc-passages", "0"])],
)
def test_cli_eval_refuses_bad_settings(tmp_path: Path, command: typer.Typer, option: list[str]) -> None:
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    result = CliRunner().invoke(command, ["eval", "--data", str(path), "--limit", "1", *option])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert option[0].lstrip("-").split("-")[0] in result.output.lower()


def test_default_reads_documents_warmed_after_neighbours_and_plain_reads_them_warmed_alone(
    fresh_engine: KVBoostRAG, passages: list[str]
) -> None:
    from kvboost_rag.eval.data import QAExample
    from kvboost_rag.records import Passage

    examples = [
        QAExample(f"Question {i}?", ("x",), tuple(Passage("", p) for p in passages[4 * i : 4 * i + 4]))
        for i in range(2)
    ]
    chosen = variants(["plain", "default"], Baseline(RepairConfig(max_tokens_per_run=None), ExactnessConfig.off()))

    def documents(i: int) -> list[str]:
        return [p.as_document() for p in examples[i].passages]

    def others(document: str) -> list[str]:
        return [d for i in range(2) for d in documents(i) if document in documents(i) and d != document]

    def shares(neighbours_for: object) -> tuple[list[float], list[float]]:
        engine = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, fresh_engine.config, name=fresh_engine.name)
        report = run_eval(engine, examples, documents, chosen, max_new_tokens=2, neighbours_for=neighbours_for)
        return [r.repair_share for r in report.records["default"]], [r.repair_share for r in report.records["plain"]]

    default, plain = shares(others)
    assert all(0 < d < p for d, p in zip(default, plain)), "less repair of chunks warmed after neighbours"
    default, plain = shares(None)
    assert default == plain, "with nothing warmed after neighbours, plain is the default"


def test_default_reads_documents_warmed_in_groups_and_nearest_its_own_store(
    fresh_engine: KVBoostRAG, passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvboost_rag.eval.data import QAExample
    from kvboost_rag.records import Passage

    examples = [
        QAExample(f"Question {i}?", ("x",), tuple(Passage("", p) for p in passages[4 * i : 4 * i + 4]))
        for i in range(2)
    ]
    documents = [[p.as_document() for p in example.passages] for example in examples]
    group_of = {d: group for group in documents for d in group}.__getitem__
    neighbours_for = lambda d: [o for o in group_of(d) if o != d]  # noqa: E731
    chosen = variants(
        ["plain", "default", "nearest"],
        Baseline(RepairConfig(max_tokens_per_run=None), ExactnessConfig.off()),
        RESEARCH_VARIANTS,
    )
    warmed: list[tuple[KVBoostRAG, list[list[str]]]] = []
    warm_together = KVBoostRAG.warm_together

    def spy(self: KVBoostRAG, groups: list[list[str]], **options: object) -> object:
        warmed.append((self, groups))
        return warm_together(self, groups, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(KVBoostRAG, "warm_together", spy)
    engine = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, fresh_engine.config, name=fresh_engine.name)
    report = run_eval(
        engine,
        examples,
        documents.__getitem__,
        chosen,
        max_new_tokens=2,
        neighbours_for=neighbours_for,
        group_of=group_of,
    )
    assert {id(store) for store, _ in warmed} == {id(engine)}, "the corpus store, warmed in groups"
    assert [documents[0]] in [groups for _, groups in warmed] and [documents[1]] in [g for _, g in warmed]
    for name in ("default", "nearest"):
        shares = [r.repair_share for r in report.records[name]]
        plain = [r.repair_share for r in report.records["plain"]]
        assert all(0 < s < p for s, p in zip(shares, plain)), f"{name}: less repair of chunks warmed with neighbours"
    engine = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, fresh_engine.config, name=fresh_engine.name)
    report = run_eval(engine, examples, documents.__getitem__, chosen, max_new_tokens=2)  # no neighbours
    shares = {name: [r.repair_share for r in records] for name, records in report.records.items() if name != "full"}
    assert shares["default"] == shares["nearest"] == shares["plain"], "nothing to warm after: every variant alone"


def test_kv_kept_variants_read_stores_of_their_own_kept_that_way(
    fresh_engine: KVBoostRAG, passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvboost_rag.eval.data import QAExample
    from kvboost_rag.records import Passage

    examples = [QAExample("Question?", ("x",), tuple(Passage("", p) for p in passages[:4]))]
    documents = [p.as_document() for p in examples[0].passages]
    baseline = Baseline(RepairConfig(), ExactnessConfig.off())
    chosen = variants(["default", "dense", "int8", "int4"], baseline, RESEARCH_VARIANTS)
    assert [v.kept_as for v in chosen[1:]] == ["engine", "dense", "int8", "int4"]
    readers: dict[str, object] = {}
    generate = KVBoostRAG.generate

    def spy(self: KVBoostRAG, prompt: object, **options: object) -> object:
        if options.get("mode") == "reuse" and "repair" in options:
            readers.setdefault(str(self.config.kv_quantization), self)
        return generate(self, prompt, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(KVBoostRAG, "generate", spy)
    engine = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, fresh_engine.config, name=fresh_engine.name)
    assert engine.config.kv_quantization is None
    group_of = lambda d: documents  # noqa: E731
    report = run_eval(
        engine, examples, lambda i: documents, chosen, max_new_tokens=2, neighbours_for=group_of, group_of=group_of
    )
    assert set(readers) == {"None", "int8", "int4"} and readers["None"] is engine, "dense is the engine's own store"
    assert report.records["dense"][0].first_token_kl == report.records["default"][0].first_token_kl
    assert report.records["int4"][0].first_token_kl != report.records["default"][0].first_token_kl
    assert report.records["int4"][0].reuse_share > 0.5, "the int4 store was warmed, in its own format"


def test_sinks_is_the_default_with_each_moved_runs_first_tokens_recomputed() -> None:
    baseline = Baseline(RepairConfig(rho=0.2, check_layer=3), ExactnessConfig(verify_margin=0.1))
    default, sinks = variants(["default", "sinks"], baseline, RESEARCH_VARIANTS)[1:]
    assert sinks.repair == RepairConfig(rho=0.2, check_layer=3, blend_boundary_tokens=4) != default.repair
    assert (sinks.mode, sinks.exactness, sinks.warming) == (default.mode, default.exactness, default.warming)


def test_strangers_as_alone_is_the_default_with_the_rule_before_strangers_had_a_share() -> None:
    default, as_alone = variants(
        ["default", "strangers-as-alone"], Baseline(RepairConfig(), ExactnessConfig()), RESEARCH_VARIANTS
    )[1:]
    assert default.repair is not None and default.repair.rho_among_strangers == RepairConfig().rho_among_strangers
    assert as_alone.repair == RepairConfig(rho_among_strangers=None)
    assert (as_alone.mode, as_alone.exactness, as_alone.warming) == (default.mode, default.exactness, default.warming)


def test_retention_is_the_share_of_full_prefills_right_answers_kept() -> None:
    from kvboost_rag.eval.runner import EvalReport, Record

    def record(question: int, em: float) -> Record:
        return Record(question, em, em, 10, 0.1, None, 0.1, 1, 0.0, 0.5, 0.1, 0.1, True, True, 0.0, 1.0, "a")

    report = EvalReport({}, {"full": [record(0, 1.0), record(1, 1.0), record(2, 0.0)]})
    report.records["default"] = [record(0, 1.0), record(1, 0.0), record(2, 1.0)]
    summary = report.summary()
    assert summary["full"]["retention"] == 1.0 and summary["default"]["retention"] == 0.5


def test_deviation_is_the_default_by_cacheblend_and_query_the_query_guided_repair() -> None:
    baseline = Baseline(RepairConfig(strategy="query", rho=0.2), ExactnessConfig(verify_margin=0.1))
    default, deviation, query = variants(["default", "deviation", "query"], baseline, RESEARCH_VARIANTS)[1:]
    assert deviation.repair == replace(baseline.repair, strategy="cacheblend")
    assert query.repair == RepairConfig.query_guided() and query.repair.strategy == "query"
    assert query.repair.blend_boundary_tokens == 4 and query.repair.rho < RepairConfig().rho
    for variant in (deviation, query):
        assert (variant.mode, variant.exactness, variant.warming) == (default.mode, default.exactness, default.warming)


def test_the_sweep_runs_each_choice_at_each_share_for_every_chunk_alike() -> None:
    swept = rho_variants(Baseline(RepairConfig(), ExactnessConfig()), [0.05, 1.0], ["cacheblend", "query"])
    assert [v.name for v in swept] == ["cacheblend@0.05", "cacheblend@1", "query@0.05", "query@1"]
    assert all(v.repair is not None and v.repair.rho_after_neighbours is None for v in swept)
    assert all(v.repair is not None and v.repair.rho_among_strangers is None for v in swept)
    assert [v.repair.strategy for v in swept if v.repair] == ["cacheblend", "cacheblend", "query", "query"]
    with pytest.raises(ValueError, match="unknown repair choices"):
        rho_variants(Baseline(RepairConfig(), ExactnessConfig()), [0.1], ["deviation"])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--strategy", "blend"], "repair strategy must be one of"),
        (["--rho-sweep", "0.1", "--sweep-choices", "cacheblend,attention"], "unknown repair choices"),
        (["--query-layers", "0"], "query-layers"),
    ],
)
def test_cli_eval_refuses_an_unknown_repair_before_answering(tmp_path: Path, extra: list[str], words: str) -> None:
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(RECORDS))
    arguments = ["eval", "--data", str(path), "--limit", "1", "--use-ctxs", "--k", "1", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(lab_app, [*arguments, *extra])
    assert result.exit_code == 2 and words in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists(), "nothing answered, nothing written"
