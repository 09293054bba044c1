"""The `kvboost-rag` command line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Position-independent KV cache reuse for RAG.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect and maintain the persistent chunk store.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

CacheDir = Annotated[Path | None, typer.Option(help="the chunk store directory (default: the user cache)")]
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def store_dir(cache_dir: Path | None) -> Path:
    from .model_loader import cache_dir as user_cache

    return cache_dir or user_cache() / "chunks"


def parse_bytes(text: str) -> int:
    """'2GiB', '500MB', '1048576' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)?\s*", text.lower())
    if match is None:
        raise typer.BadParameter(f"not a size: {text!r} (try 2GiB or 500MB)")
    return int(float(match[1]) * UNITS[match[2] or "b"])


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
        str, typer.Option(help="comma list of full,prefix,none,boundary,cacheblend,default,verify,refresh")
    ] = "full,none,boundary,cacheblend,default",
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
    verify_margin: Annotated[
        float | None, typer.Option(help="a token leading by less than this is recomputed on exact KV")
    ] = None,
    refresh: Annotated[
        bool | None, typer.Option(help="'default': recompute the prompt after the first token")
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
    from .evaluation import DEFAULT_TEMPLATE, Variant, decode_variants, rho_variants, run_eval, standard_variants
    from .qa_dataset import default_nq_path, load_qa

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
            verify_margin=verify_margin,
            refresh=refresh,
        ).items()
        if value is not None
    }
    base = replace(engine.config.repair, strategy="cacheblend", **changes)
    extra = [Variant("prefix", "prefix"), *decode_variants(base)]
    available = {v.name: v for v in standard_variants(base) + extra}
    names = [n.strip() for n in variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise typer.BadParameter(f"unknown variants {unknown}; choose from {sorted(available)}")
    chosen_variants = [available["full"]] + [available[n] for n in names if n != "full"]
    sweep = rho_variants(base, _floats(rho_sweep)) if rho_sweep else []

    if use_ctxs:
        passages_for = lambda i: [p.as_document() for p in chosen[i].passages[:k]]  # noqa: E731
    else:
        from .retrieval import retrieve_documents

        retrieved = retrieve_documents(examples, chosen, k)
        passages_for = lambda i: list(retrieved[i])  # noqa: E731
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


@app.command()
def warm(
    paths: Annotated[list[Path], typer.Argument(help=".txt, .md, .json, .jsonl (.gz) files or directories")],
    cache_dir: CacheDir = None,
    model: Annotated[str | None, typer.Option(help="model name, folder or GGUF; default the embedded one")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 or bfloat16")] = None,
    chunk_size: Annotated[int, typer.Option()] = 128,
    chunking: Annotated[str, typer.Option(help="fixed, semantic or adaptive")] = "fixed",
    quantization: Annotated[str | None, typer.Option(help="int8 or int4 (default: none)")] = None,
    warm_prefix: Annotated[str, typer.Option(help="text encoded before each document, not kept")] = "",
    memory_budget: Annotated[str, typer.Option(help="memory for chunks while warming")] = "1GiB",
) -> None:
    """Pre-warm documents into the persistent chunk store. Idempotent and resumable: documents
    already stored are skipped without model work, so an interrupted run continues."""
    from tqdm import tqdm

    from . import EngineConfig, KVBoostRAG
    from .corpus_files import document_files, read_documents

    try:
        files = document_files(paths)
        documents = [doc for path in files for doc in read_documents(path)]
        config = EngineConfig(
            chunk_size=chunk_size,
            chunking=chunking,
            kv_quantization=quantization,
            warm_prefix=warm_prefix,  # type: ignore[arg-type]
            memory_budget_bytes=parse_bytes(memory_budget),
            cache_dir=str(store_dir(cache_dir)),
        )
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from error
    if not documents:
        raise typer.BadParameter("no documents found in " + ", ".join(map(str, paths)))
    engine = KVBoostRAG.from_pretrained(model, dtype=dtype, config=config)
    skipped = chunks = 0
    # Progress in characters: proportional to the work, without tokenizing every document twice.
    with tqdm(total=sum(map(len, documents)), unit="char", unit_scale=True, desc=f"warm {len(documents)} docs") as bar:
        for document in documents:
            report = engine.warm(document)
            skipped += report.skipped_documents
            chunks += report.chunks_stored
            bar.update(len(document))
    typer.echo(
        f"{len(documents)} documents from {len(files)} files: {len(documents) - skipped} warmed ({chunks} chunks), "
        f"{skipped} already warm. Store: {config.cache_dir}"
    )


@cache_app.command("stats")
def cache_stats(cache_dir: CacheDir = None) -> None:
    """What is stored: documents, chunks and bytes per model."""
    from .disk_store import DiskStore

    store = DiskStore(store_dir(cache_dir), match_window=16)
    rows = store.stats()
    typer.echo(f"{store.root}")
    typer.echo(f"{'model fingerprint':18} {'documents':>9} {'chunks':>8} {'MiB':>9} {'pinned':>7}")
    for row in rows:
        typer.echo(
            f"{row.fingerprint:18} {row.documents:9} {row.chunks:8} {row.bytes / 2**20:9.1f} {row.pinned_chunks:7}"
        )
    if not rows:
        typer.echo("(empty)")


@cache_app.command("verify")
def cache_verify(cache_dir: CacheDir = None) -> None:
    """Check every stored chunk; corrupted ones are dropped (and recomputed when next warmed)."""
    from .disk_store import DiskStore

    report = DiskStore(store_dir(cache_dir), match_window=16).verify()
    typer.echo(
        f"checked {report.checked} chunks: {len(report.dropped)} dropped, {report.orphans_removed} stray files removed"
    )
    if report.dropped:
        raise typer.Exit(code=1)


@cache_app.command("prune")
def cache_prune(
    budget: Annotated[str, typer.Option(help="keep at most this much, e.g. 2GiB")],
    cache_dir: CacheDir = None,
) -> None:
    """Evict least recently used, unpinned chunks until the store fits the budget."""
    from .disk_store import DiskStore

    store = DiskStore(store_dir(cache_dir), match_window=16)
    evicted = store.prune(parse_bytes(budget))
    typer.echo(f"evicted {evicted} chunks; {store.total_bytes() / 2**20:.1f} MiB stored")


if __name__ == "__main__":
    app()
