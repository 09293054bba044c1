"""The `kvboost-rag` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Position-independent KV cache reuse for RAG.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """kvboost-rag: warm documents once, reuse their KV wherever they land in later prompts."""


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as error:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from error


@app.command("eval")
def eval_command(
    data: Annotated[Path | None, typer.Option(help="QA file (jsonl or json list, .gz or not); default NQ-Open")] = None,
    limit: Annotated[int, typer.Option(help="questions to answer")] = 500,
    k: Annotated[int, typer.Option(help="passages per prompt")] = 5,
    use_ctxs: Annotated[bool, typer.Option(help="use each example's own ctxs instead of retrieval")] = False,
    seed: Annotated[int, typer.Option(help="question sample and passage order")] = 0,
    variants: Annotated[
        str, typer.Option(help="comma list of full,prefix,none,boundary,cacheblend")
    ] = "full,none,boundary,cacheblend",
    rho_sweep: Annotated[
        str, typer.Option(help="CacheBlend rho values to sweep, comma list; '' for none")
    ] = "0.05,0.3,0.5",
    sweep_limit: Annotated[int, typer.Option(help="questions for the rho sweep")] = 200,
    rho: Annotated[float | None, typer.Option(help="CacheBlend rho (default: the engine's)")] = None,
    check_layer: Annotated[int | None, typer.Option(help="CacheBlend check layer")] = None,
    deviation: Annotated[str | None, typer.Option(help="CacheBlend deviation: value or key")] = None,
    boundary_tokens: Annotated[int | None, typer.Option(help="tokens recomputed at each run start (boundary)")] = None,
    blend_boundary_tokens: Annotated[
        int | None, typer.Option(help="run-start tokens CacheBlend always recomputes")
    ] = None,
    template: Annotated[
        str | None, typer.Option(help="user prompt with {documents} and {question}; a path or text")
    ] = None,
    chat: Annotated[bool, typer.Option(help="wrap the prompt in the model's chat template")] = True,
    max_new_tokens: Annotated[int, typer.Option()] = 32,
    model: Annotated[str | None, typer.Option(help="model name, folder or GGUF; default the embedded one")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 or bfloat16")] = None,
    out: Annotated[Path, typer.Option(help="directory for the JSON, Markdown and plot")] = Path("eval-results"),
) -> None:
    """NaturalQuestions-style accuracy and TTFT of every reuse variant against full prefill."""
    import random
    from dataclasses import replace

    from tqdm import tqdm

    from . import KVBoostRAG
    from .eval_report import format_table, write
    from .evaluation import DEFAULT_TEMPLATE, Variant, rho_variants, run_eval, standard_variants
    from .qa_dataset import corpus, default_nq_path, load_qa

    path = data or default_nq_path()
    examples = load_qa(path)
    if not examples:
        raise typer.BadParameter(f"{path} holds no examples")
    chosen = random.Random(seed).sample(examples, min(limit, len(examples)))
    engine = KVBoostRAG.from_pretrained(model, dtype=dtype)
    changes = {
        name: value
        for name, value in dict(
            rho=rho,
            check_layer=check_layer,
            deviation=deviation,
            boundary_tokens=boundary_tokens,
            blend_boundary_tokens=blend_boundary_tokens,
        ).items()
        if value is not None
    }
    base = replace(engine.config.repair, strategy="cacheblend", **changes)
    available = {v.name: v for v in standard_variants(base)} | {"prefix": Variant("prefix", "prefix")}
    names = [n.strip() for n in variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise typer.BadParameter(f"unknown variants {unknown}; choose from {sorted(available)}")
    chosen_variants = [available["full"]] + [available[n] for n in names if n != "full"]
    sweep = rho_variants(base, _floats(rho_sweep)) if rho_sweep else []

    if use_ctxs:
        passages_for = lambda i: [p.as_document() for p in chosen[i].passages[:k]]  # noqa: E731
    else:
        from .retrieval import PassageIndex

        index = PassageIndex.build(corpus(examples))
        retrieved = index.search([e.question for e in chosen], k)
        passages_for = lambda i: [p.as_document() for p in retrieved[i]]  # noqa: E731
    template_text = DEFAULT_TEMPLATE
    if template:
        template_text = Path(template).read_text() if Path(template).is_file() else template
        if "{documents}" not in template_text or "{question}" not in template_text:
            raise typer.BadParameter("the template needs {documents} and {question}")
    settings = dict(
        data=str(path.name),
        questions=len(chosen),
        k=k,
        retrieval="ctxs" if use_ctxs else "faiss",
        seed=seed,
        model=engine.name,
        dtype=str(engine.dtype),
        repair=str(base),
        sweep_questions=min(sweep_limit, len(chosen)),
        max_new_tokens=max_new_tokens,
        chat=chat,
    )
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
        progress=lambda it: tqdm(it, desc=f"eval k={k}", unit="q"),
        settings=settings,
    )
    typer.echo(format_table(report))
    paths = write(report, out, f"eval_k{k}_n{len(chosen)}")
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()))


if __name__ == "__main__":
    app()
