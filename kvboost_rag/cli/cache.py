"""`kvboost-rag cache stats|verify|prune`: inspect and maintain the persistent chunk store."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import StoreOption, cache_app, store_dir
from .sizes import parse_bytes


def _open(store: str | None):  # noqa: ANN202 - DiskStore, imported lazily (it loads torch)
    from ..store.disk import DiskStore

    return DiskStore(store_dir(store))


@cache_app.command("stats")
def cache_stats(store: StoreOption = None) -> None:
    """What is stored: documents, chunks and bytes per model."""
    disk = _open(store)
    rows = disk.stats()
    typer.echo(f"{disk.root}")
    typer.echo(f"{'model fingerprint':18} {'documents':>9} {'chunks':>8} {'MiB':>9} {'pinned':>7}")
    for row in rows:
        typer.echo(
            f"{row.fingerprint:18} {row.documents:9} {row.chunks:8} {row.bytes / 2**20:9.1f} {row.pinned_chunks:7}"
        )
    if not rows:
        typer.echo("(empty)")


@cache_app.command("verify")
def cache_verify(store: StoreOption = None) -> None:
    """Check every stored chunk; corrupted ones are dropped (and recomputed when next warmed)."""
    report = _open(store).verify()
    typer.echo(
        f"checked {report.checked} chunks: {len(report.dropped)} dropped, {report.orphans_removed} stray files removed"
    )
    if report.dropped:
        raise typer.Exit(code=1)


@cache_app.command("prune")
def cache_prune(
    budget: Annotated[str, typer.Option(help="keep at most this much, e.g. 2GiB")],
    store: StoreOption = None,
) -> None:
    """Evict least recently used, unpinned chunks until the store fits the budget."""
    disk = _open(store)
    evicted = disk.prune(parse_bytes(budget))
    typer.echo(f"evicted {evicted} chunks; {disk.total_bytes() / 2**20:.1f} MiB stored")
