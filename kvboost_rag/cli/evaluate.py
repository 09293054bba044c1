"""`kvboost-rag eval`: NaturalQuestions-style accuracy and timings of the product's variants
(full prefill, the default, plain) against full prefill, under any engine option of the table.

`run_evaluation` is the whole run; the lab's `kvboost-lab eval` calls it with its research
variants and flags (`lab/kvboost_lab/eval_cli.py`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..config import MEMORY_ONLY
from ..eval.variants import DEFAULT_VARIANTS, VARIANTS, Builder, described
from ..neighbours import DEFAULT_NEIGHBOURS
from .app import app, store_location
from .options import Command, table_options

if TYPE_CHECKING:
    from ..eval.data import QAExample
    from ..eval.variants import Baseline, Variant

# Sized for a CPU (issue 32): the former seven variants and rho sweep took ~175 s a question on
# one, so 500 questions took a day; 500 narrows EM's interval to a few points where there is time.
DEFAULT_LIMIT = 20


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


ENGINE_OPTIONS_OF_EVAL = (
    "model",
    "dtype",
    "weights",
    "device",
    "store",
    "repair",
    "exactness",
    "chunk_size",
    "chunking",
    "match_window",
    "kv_quantization",
    "draft_tokens",
)


@dataclass(slots=True)
class EvalRun:
    """What one eval answers and where it writes. The product's command sets the first fields;
    the research knobs below them keep their defaults there (the lab's command sets them)."""

    data: Path | None = None
    limit: int = DEFAULT_LIMIT
    k: int = 5
    seed: int = 0
    use_ctxs: bool = False
    warm_neighbours: int | None = None
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    max_new_tokens: int = 32
    out: Path = Path("eval-results")
    wide: bool = False
    # research: long documents, warming in parts, random or second-corpus fillers, the prompt
    doc_passages: int = 1
    warm_in_parts: int = 1
    random_others: bool = False
    others_from: Path | None = None
    template: str | None = None
    chat: bool = True
    sweep_limit: int = 200


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


# The product's flags: (name, annotation); `eval_flags` puts them on a command, each defaulting
# to its `EvalRun` field.
EVAL_FLAGS: tuple[tuple[str, Any], ...] = (
    (
        "data",
        Annotated[
            Path | None,
            typer.Option(
                help="QA file (jsonl or json list, .gz or not); default NQ-Open",
                exists=True,
                dir_okay=False,
                readable=True,
            ),
        ],
    ),
    (
        "limit",
        Annotated[
            int,
            typer.Option(
                help=f"questions to answer: {DEFAULT_LIMIT} suits a CPU run (the progress bar shows the time "
                "left); 500 for EM within a few points",
                min=1,
            ),
        ],
    ),
    ("k", Annotated[int, typer.Option(help="passages per prompt", min=1)]),
    ("seed", Annotated[int, typer.Option(help="question sample and passage order")]),
    ("use_ctxs", Annotated[bool, typer.Option(help="use each example's own ctxs instead of retrieval")]),
    (
        "warm_neighbours",
        Annotated[
            int | None,
            typer.Option(
                help="warm documents among their N nearest corpus documents (in groups of mutual neighbours), "
                f"as `kvboost-rag warm` does; 0: alone [default: {DEFAULT_NEIGHBOURS}; 0 with --use-ctxs]",
                min=0,
            ),
        ],
    ),
    ("variants", Annotated[str, typer.Option(help="comma list of variants (listed below); full always runs")]),
    ("max_new_tokens", Annotated[int, typer.Option(min=1)]),
    ("out", Annotated[Path, typer.Option(help="directory for the JSON, Markdown and plot")]),
    ("wide", Annotated[bool, typer.Option(help="print every column, not the short table (the Markdown has both)")]),
)


def _flag_default(name: str) -> Any:
    """A product flag's default: its `EvalRun` field's."""
    if name == "variants":  # a list in the run, comma-separated on the command line
        return ",".join(DEFAULT_VARIANTS)
    return next(f.default for f in fields(EvalRun) if f.name == name)


def eval_flags(command: Command) -> Command:
    """The product's eval flags on `command`, which takes them as one `run: EvalRun` (the lab's
    `kvboost-lab eval` adds its research flags beside them)."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "run"]
    flags = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_flag_default(name), annotation=annotation)
        for name, annotation in EVAL_FLAGS
    ]
    parameters = flags + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]

    @functools.wraps(command)
    def with_run(**values: Any) -> Any:
        given = {name: values.pop(name) for name, _ in EVAL_FLAGS}
        return command(**values, run=EvalRun(**given | {"variants": _names(given["variants"])}))

    with_run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    with_run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
    return with_run  # type: ignore[return-value]


@app.command("eval", epilog="Variants (--variants):\n" + described())
@table_options(*ENGINE_OPTIONS_OF_EVAL, defaults={"store": MEMORY_ONLY})
@eval_flags
def eval_command(*, run: EvalRun, options: dict[str, Any]) -> None:
    """Every variant answers the same prompts as full prefill; the eval keeps its chunks in
    memory unless --store names a directory, so it never fills the user's store."""
    run_evaluation(run, options)


def run_evaluation(
    run: EvalRun,
    options: dict[str, Any],
    registry: Mapping[str, Builder] = VARIANTS,
    repair_changes: Mapping[str, Any] | None = None,
    sweep: Callable[[Baseline], list[Variant]] | None = None,
) -> None:
    """The eval: questions drawn, the engine built from `options`, documents retrieved and warmed,
    every variant of `registry` that `run` names (and `sweep`'s, on the first `sweep_limit`
    questions) answering the same prompts as full prefill; the table printed and written.
    `repair_changes`: RepairConfig fields over the engine's repair, for every variant."""
    import random
    from dataclasses import replace

    from tqdm import tqdm

    from ..config import ExactnessConfig, RepairConfig
    from ..eval.data import default_nq_path, load_qa
    from ..eval.prompt import TEMPLATE
    from ..eval.report import format_table, write
    from ..eval.runner import run_eval
    from ..eval.variants import Baseline
    from ..eval.variants import variants as build_variants
    from ..hf.fingerprint import weight_format
    from ..hf.loader import quiet_loading
    from ..options import build_engine

    data, limit, k, seed, use_ctxs, warm_neighbours = (
        run.data,
        run.limit,
        run.k,
        run.seed,
        run.use_ctxs,
        run.warm_neighbours,
    )
    doc_passages, warm_in_parts, random_others, others_from = (
        run.doc_passages,
        run.warm_in_parts,
        run.random_others,
        run.others_from,
    )
    template, chat, max_new_tokens, sweep_limit = run.template, run.chat, run.max_new_tokens, run.sweep_limit
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
    changes = dict(repair_changes or {})

    def chosen_for(repair: RepairConfig, exactness: ExactnessConfig) -> tuple[list[Variant], list[Variant], Baseline]:
        """The variants and the sweep over the engine's settings with the command line's changes."""
        try:
            baseline = Baseline(replace(repair, **changes), exactness)
            chosen_variants = build_variants(run.variants, baseline, registry)
            swept = sweep(baseline) if sweep is not None else []
        except ValueError as error:
            raise typer.BadParameter(str(error)) from error
        return chosen_variants, swept, baseline

    chosen_for(RepairConfig(), ExactnessConfig())  # refused before the model loads
    _say(f"loading the model ({options.get('model') or 'the default'})")
    with quiet_loading():  # the eval's own bars only
        engine = build_engine({**options, "store": store_location(options.get("store"))})
    chosen_variants, swept, baseline = chosen_for(engine.config.repair, engine.config.exactness)

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
        kv_at_rest=engine.config.kept_as or "dense",  # how warmed chunks are kept (the default's)
        repair=str(baseline.repair),
        exactness=str(baseline.exactness),
        sweep_questions=min(sweep_limit, len(chosen)),
        max_new_tokens=max_new_tokens,
        chat=chat,
    )
    _say(
        f"{len(chosen)} questions, each warmed, then answered by {', '.join(v.name for v in chosen_variants)}"
        + (f"; the first {settings['sweep_questions']} also by {', '.join(v.name for v in swept)}" if swept else "")
    )
    with tqdm(total=len(chosen), desc="warming", unit="q") as bar:
        report = run_eval(
            engine,
            chosen,
            passages_for,
            chosen_variants,
            sweep=swept,
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
    typer.echo(format_table(report, full=run.wide))
    stem = f"eval_k{k}_n{len(chosen)}" + (f"_docs{doc_passages}" if doc_passages > 1 and not use_ctxs else "")
    stem += f"_nb{warm_neighbours}" if warm_neighbours != DEFAULT_NEIGHBOURS and not use_ctxs else ""
    stem += f"_parts{warm_in_parts}" if warm_in_parts > 1 else ""
    stem += "_random" if random_others and not use_ctxs else ""
    stem += "_two_corpora" if others_from else ""
    paths = write(report, run.out, stem)
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()))
