"""`kvboost-rag eval`: NaturalQuestions-style accuracy and timings of every variant against full prefill."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..config import MEMORY_ONLY
from ..eval.variants import DEFAULT_VARIANTS, described
from ..neighbours import DEFAULT_NEIGHBOURS
from .app import app, store_location
from .options import table_options

if TYPE_CHECKING:
    from ..eval.data import QAExample

# Sized for a CPU (issue 32): the former seven variants and rho sweep took ~175 s a question on
# one, so 500 questions took a day; 500 narrows EM's interval to a few points where there is time.
DEFAULT_LIMIT = 20


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from error


def _groups(sample: list[str], neighbours_for: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """Each sample document's group of mutual neighbours, as `kvboost-rag warm` groups a corpus
    (`groups_among` over the documents the questions retrieve)."""
    from ..neighbours import groups_among

    group = {member: members for members in groups_among(sample, neighbours_for) for member in members}
    return lambda document: group.get(document, [document])


def _other_corpus(path: Path) -> list[QAExample]:
    """The second corpus of `--others-from`, checked before the model loads."""
    from ..eval.data import corpus, load_qa

    try:
        examples = load_qa(path)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--others-from") from error
    if not corpus(examples):
        raise typer.BadParameter(f"{path} holds no passages (ctxs)", param_hint="--others-from")
    return examples


def _say(text: str) -> None:
    """A stage's line on stderr, beside the progress bars, so stdout keeps only the table."""
    typer.echo(text, err=True)


def _counted(items: Iterable[int], count: Callable[[int], object]) -> Iterator[int]:
    """`items`, counting each once its work is done: the bar's rate, and so its time left, is per
    whole question."""
    for item in items:
        yield item
        count(1)


@app.command("eval", epilog="Variants (--variants):\n" + described())
@table_options("model", "dtype", "weights", "device", "store", defaults={"store": MEMORY_ONLY})
def eval_command(
    data: Annotated[
        Path | None,
        typer.Option(
            help="QA file (jsonl or json list, .gz or not); default NQ-Open", exists=True, dir_okay=False, readable=True
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            help=f"questions to answer: {DEFAULT_LIMIT} suits a CPU run (the progress bar shows the time left); "
            "500 for EM within a few points",
            min=1,
        ),
    ] = DEFAULT_LIMIT,
    k: Annotated[int, typer.Option(help="passages per prompt")] = 5,
    doc_passages: Annotated[
        int, typer.Option(help="passages per document: >1 joins neighbouring passages into long documents")
    ] = 1,
    warm_neighbours: Annotated[
        int | None,
        typer.Option(
            help="warm documents among their N nearest corpus documents (FusionRAG; in groups of mutual "
            f"neighbours), as `kvboost-rag warm` does; 0: alone [default: {DEFAULT_NEIGHBOURS}; 0 with --use-ctxs]",
            min=0,
        ),
    ] = None,
    warm_in_parts: Annotated[
        int,
        typer.Option(
            help="warm the corpus as N runs of `kvboost-rag warm` over a growing folder: a document's "
            "neighbours come from its run and earlier ones",
            min=1,
        ),
    ] = 1,
    random_others: Annotated[
        bool,
        typer.Option(
            help="keep each question's best passage and fill the prompt with random corpus ones (not neighbours)"
        ),
    ] = False,
    others_from: Annotated[
        Path | None,
        typer.Option(
            help="fill half of each prompt with the question's nearest passages of a second corpus (a QA file's "
            "ctxs, e.g. datasets/python_reference), warmed among that corpus: documents from two corpora",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    use_ctxs: Annotated[bool, typer.Option(help="use each example's own ctxs instead of retrieval")] = False,
    seed: Annotated[int, typer.Option(help="question sample and passage order")] = 0,
    variants: Annotated[str, typer.Option(help="comma list of variants (listed below); full always runs")] = ",".join(
        DEFAULT_VARIANTS
    ),
    rho_sweep: Annotated[
        str,
        typer.Option(
            help="repair shares to sweep for each --sweep-choices, comma list, e.g. 0.05,0.3,0.5 (none by default)"
        ),
    ] = "",
    sweep_choices: Annotated[
        str, typer.Option(help="how the swept repairs choose tokens, comma list: cacheblend (deviation), query")
    ] = "cacheblend",
    sweep_limit: Annotated[int, typer.Option(help="questions for the rho sweep")] = 200,
    strategy: Annotated[
        str | None, typer.Option(help="'default': repair strategy (none, boundary, cacheblend, query)")
    ] = None,
    query_layers: Annotated[
        int | None, typer.Option(help="query repair: last layers whose attention ranks the tokens", min=1)
    ] = None,
    max_tokens_per_run: Annotated[
        int | None, typer.Option(help="repair: most tokens recomputed a reused run (0: no cap)", min=0)
    ] = None,
    rho: Annotated[
        float | None, typer.Option(help="'default': share of moved tokens repaired (default: the engine's)")
    ] = None,
    check_layer: Annotated[int | None, typer.Option(help="CacheBlend check layer")] = None,
    deviation: Annotated[str | None, typer.Option(help="CacheBlend deviation: value or key")] = None,
    boundary_tokens: Annotated[int | None, typer.Option(help="tokens recomputed at each run start (boundary)")] = None,
    blend_boundary_tokens: Annotated[
        int | None, typer.Option(help="'default': each moved run's first tokens always recomputed")
    ] = None,
    verify_margin: Annotated[
        float | None, typer.Option(help="a token leading by less than this is recomputed on exact KV")
    ] = None,
    verify_tokens: Annotated[
        int | None, typer.Option(help="'default': leading answer tokens checked for near-ties (0: none)")
    ] = None,
    refresh: Annotated[bool | None, typer.Option(help="'default': recompute the prompt after the first token")] = None,
    settle_share: Annotated[
        float | None,
        typer.Option(help="'default': a near-tied first token first recomputes this share (0: the prompt)"),
    ] = None,
    template: Annotated[
        str | None, typer.Option(help="user prompt with {documents} and {question}; a path or text")
    ] = None,
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the model's chat template")] = True,
    max_new_tokens: Annotated[int, typer.Option()] = 32,
    out: Annotated[Path, typer.Option(help="directory for the JSON, Markdown and plot")] = Path("eval-results"),
    wide: Annotated[bool, typer.Option(help="print every column, not the short table (the Markdown has both)")] = False,
    *,
    options: dict[str, Any],
) -> None:
    """Every variant answers the same prompts as full prefill; the eval keeps its chunks in
    memory unless --store names a directory, so it never fills the user's store."""
    import random
    from dataclasses import replace

    from tqdm import tqdm

    from ..config import ExactnessConfig, RepairConfig
    from ..eval.data import default_nq_path, load_qa
    from ..eval.prompt import TEMPLATE
    from ..eval.report import format_table, write
    from ..eval.runner import run_eval
    from ..eval.variants import Baseline, Variant, rho_variants
    from ..eval.variants import variants as build_variants
    from ..hf.fingerprint import weight_format
    from ..hf.loader import quiet_loading
    from ..options import build_engine

    try:
        path = data or default_nq_path()
        examples = load_qa(path)
    except (FileNotFoundError, ValueError) as error:
        raise typer.BadParameter(str(error), param_hint="--data") from error
    if not examples:
        raise typer.BadParameter(f"{path} holds no examples", param_hint="--data")
    chosen = random.Random(seed).sample(examples, min(limit, len(examples)))
    if others_from is not None and (use_ctxs or random_others):
        raise typer.BadParameter("--others-from retrieves from two corpora: not with --use-ctxs or --random-others")
    other_corpus = _other_corpus(others_from) if others_from is not None else None
    repair_changes: dict[str, Any] = dict(
        strategy=strategy,
        query_layers=query_layers,
        rho=rho,
        check_layer=check_layer,
        deviation=deviation,
        boundary_tokens=boundary_tokens,
        blend_boundary_tokens=blend_boundary_tokens,
    )
    repair_changes = {k: v for k, v in repair_changes.items() if v is not None}
    if max_tokens_per_run is not None:
        repair_changes["max_tokens_per_run"] = max_tokens_per_run or None  # 0: no cap
    exactness_changes: dict[str, Any] = dict(
        verify_margin=verify_margin, verify_tokens=verify_tokens, refresh=refresh, settle_share=settle_share
    )
    exactness_changes = {k: v for k, v in exactness_changes.items() if v is not None}

    def chosen_for(repair: RepairConfig, exactness: ExactnessConfig) -> tuple[list[Variant], list[Variant], Baseline]:
        """The variants and the sweep over the engine's settings with the command line's changes."""
        try:
            baseline = Baseline(replace(repair, **repair_changes), replace(exactness, **exactness_changes))
            chosen_variants = build_variants([n.strip() for n in variants.split(",") if n.strip()], baseline)
            choices = [c.strip() for c in sweep_choices.split(",") if c.strip()]
            sweep = rho_variants(baseline, _floats(rho_sweep), choices) if rho_sweep else []
        except ValueError as error:
            raise typer.BadParameter(str(error)) from error
        return chosen_variants, sweep, baseline

    chosen_for(RepairConfig(), ExactnessConfig())  # refused before the model loads
    _say(f"loading the model ({options.get('model') or 'the default'})")
    with quiet_loading():  # the eval's own bars only
        engine = build_engine({**options, "store": store_location(options.get("store"))})
    chosen_variants, sweep, baseline = chosen_for(engine.config.repair, engine.config.exactness)

    other_index = None
    if use_ctxs:
        passages_for = lambda i: [p.as_document() for p in chosen[i].passages[:k]]  # noqa: E731
    else:
        from ..eval.retrieval import corpus_index, retrieve_documents, two_corpora_documents

        if doc_passages < 1:
            raise typer.BadParameter(f"--doc-passages must be >= 1, got {doc_passages}")
        _say(f"retrieving {k} documents a question")
        with quiet_loading():  # the embedder's load, for either corpus
            index = corpus_index(examples, doc_passages)
            if other_corpus is not None:
                other_index = corpus_index(other_corpus, doc_passages)
                retrieved = two_corpora_documents(index, other_index, chosen, k)
            else:
                retrieved = retrieve_documents(index, chosen, k)
        if random_others:  # documents that are not each other's neighbours: robustness of the warming
            every = [p.as_document() for p in index.passages]
            retrieved = [
                [r[0], *random.Random(f"{seed}:others:{i}").sample([d for d in every if d != r[0]], k - 1)]
                for i, r in enumerate(retrieved)
            ]
        passages_for = lambda i: list(retrieved[i])  # noqa: E731
    if warm_neighbours is None:
        warm_neighbours = 0 if use_ctxs else DEFAULT_NEIGHBOURS
    neighbours_for = None
    if warm_neighbours:
        if use_ctxs:
            raise typer.BadParameter("--warm-neighbours needs retrieval (not --use-ctxs)")
        nearest = index.neighbours(warm_neighbours, parts=warm_in_parts, seed=seed)
        if other_index is not None:  # each corpus warmed by its own `kvboost-rag warm`
            nearest.update(other_index.neighbours(warm_neighbours, parts=warm_in_parts, seed=seed))
        neighbours_for = lambda document: nearest.get(document, [])  # noqa: E731
    group_of = None
    if neighbours_for is not None:  # as `kvboost-rag warm` warms by default
        group_of = _groups(list(dict.fromkeys(d for i in range(len(chosen)) for d in passages_for(i))), neighbours_for)
    template_text = TEMPLATE
    if template:
        template_text = Path(template).read_text() if Path(template).is_file() else template
        if "{documents}" not in template_text or "{question}" not in template_text:
            raise typer.BadParameter("the template needs {documents} and {question}")
    settings = dict(
        data=str(path.name),
        questions=len(chosen),
        k=k,
        retrieval="ctxs" if use_ctxs else "faiss",
        random_others=random_others,
        others_from=others_from.name if others_from else None,
        passages_per_document=1 if use_ctxs else doc_passages,
        warm_neighbours=warm_neighbours,
        warming="groups" if group_of else "alone",
        warm_in_parts=warm_in_parts,
        seed=seed,
        model=engine.name,
        dtype=str(engine.dtype),
        weights=weight_format(engine.model),
        repair=str(baseline.repair),
        exactness=str(baseline.exactness),
        sweep_questions=min(sweep_limit, len(chosen)),
        max_new_tokens=max_new_tokens,
        chat=chat,
    )
    _say(
        f"{len(chosen)} questions, each warmed, then answered by {', '.join(v.name for v in chosen_variants)}"
        + (f"; the first {settings['sweep_questions']} also by {', '.join(v.name for v in sweep)}" if sweep else "")
    )
    with tqdm(total=len(chosen), desc="warming", unit="q") as bar:
        report = run_eval(
            engine,
            chosen,
            passages_for,
            chosen_variants,
            sweep=sweep,
            sweep_questions=sweep_limit,
            seed=seed,
            template=template_text,
            chat=chat,
            max_new_tokens=max_new_tokens,
            progress=lambda items: _counted(items, bar.update),
            stage=bar.set_description_str,
            settings=settings,
            neighbours_for=neighbours_for,
            group_of=group_of,
        )
    typer.echo(format_table(report, full=wide))
    stem = f"eval_k{k}_n{len(chosen)}" + (f"_docs{doc_passages}" if doc_passages > 1 and not use_ctxs else "")
    stem += f"_nb{warm_neighbours}" if warm_neighbours != DEFAULT_NEIGHBOURS and not use_ctxs else ""
    stem += f"_parts{warm_in_parts}" if warm_in_parts > 1 else ""
    stem += "_random" if random_others and not use_ctxs else ""
    stem += "_two_corpora" if others_from else ""
    paths = write(report, out, stem)
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()))
