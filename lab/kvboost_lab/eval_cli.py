"""`kvboost-lab eval`: the eval with the research variants and flags (`python -m kvboost_lab.eval_cli`).

The product's `kvboost-rag eval` answers with full prefill, the default and plain, under any
engine option; this one takes the same flags and the research beside them: each technique alone
and the repair's alternatives (`kvboost_lab.variants`), a rho sweep over the repair's choices, the
repair's fields one by one, long documents, warming in parts, random or second-corpus fillers, a
prompt template. Both run `kvboost_rag.cli.evaluate.run_evaluation`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from kvboost_rag.cli.evaluate import ENGINE_OPTIONS_OF_EVAL, EvalRun, eval_flags, run_evaluation
from kvboost_rag.cli.options import table_options
from kvboost_rag.config import MEMORY_ONLY
from kvboost_rag.eval.variants import Baseline, Variant, described

from .variants import RESEARCH_VARIANTS, rho_variants

app = typer.Typer(add_completion=False, no_args_is_help=True, help="kvboost-rag's research commands")


@app.callback()
def lab() -> None:
    """kvboost-rag's research commands (the product's are `kvboost-rag`)."""


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from error


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


@app.command("eval", epilog="Variants (--variants):\n" + described(RESEARCH_VARIANTS))
@table_options(*ENGINE_OPTIONS_OF_EVAL, defaults={"store": MEMORY_ONLY})
@eval_flags
def eval_command(
    doc_passages: Annotated[
        int, typer.Option(help="passages per document: >1 joins neighbouring passages into long documents")
    ] = 1,
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
    template: Annotated[
        str | None, typer.Option(help="user prompt with {documents} and {question}; a path or text")
    ] = None,
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the model's chat template")] = True,
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
    strategy: Annotated[str | None, typer.Option(help="repair strategy (none, boundary, cacheblend, query)")] = None,
    query_layers: Annotated[
        int | None, typer.Option(help="query repair: last layers whose attention ranks the tokens", min=1)
    ] = None,
    max_tokens_per_run: Annotated[
        int | None, typer.Option(help="repair: most tokens recomputed a reused run (0: no cap)", min=0)
    ] = None,
    rho: Annotated[float | None, typer.Option(help="share of moved tokens repaired (default: the engine's)")] = None,
    check_layer: Annotated[int | None, typer.Option(help="CacheBlend check layer")] = None,
    deviation: Annotated[str | None, typer.Option(help="CacheBlend deviation: value or key")] = None,
    boundary_tokens: Annotated[int | None, typer.Option(help="tokens recomputed at each run start (boundary)")] = None,
    blend_boundary_tokens: Annotated[
        int | None, typer.Option(help="each moved run's first tokens always recomputed")
    ] = None,
    *,
    run: EvalRun,
    options: dict[str, Any],
) -> None:
    """The product's eval with the research variants, the rho sweep and the repair's fields; the
    repair flags change the engine's repair for every variant."""
    changes: dict[str, Any] = dict(
        strategy=strategy,
        query_layers=query_layers,
        rho=rho,
        check_layer=check_layer,
        deviation=deviation,
        boundary_tokens=boundary_tokens,
        blend_boundary_tokens=blend_boundary_tokens,
    )
    changes = {name: value for name, value in changes.items() if value is not None}
    if max_tokens_per_run is not None:
        changes["max_tokens_per_run"] = max_tokens_per_run or None  # 0: no cap
    shares, choices = _floats(rho_sweep), _names(sweep_choices)

    def sweep(baseline: Baseline) -> list[Variant]:
        return rho_variants(baseline, shares, choices) if shares else []

    research = dict(doc_passages=doc_passages, warm_in_parts=warm_in_parts, random_others=random_others)
    research |= dict(others_from=others_from, template=template, chat=chat, sweep_limit=sweep_limit)
    run = replace(run, **research)
    run_evaluation(run, options, RESEARCH_VARIANTS, changes, sweep)


if __name__ == "__main__":
    app()
