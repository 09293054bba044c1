"""`kvboost-rag cache stats|verify|prune`: inspect and maintain the persistent chunk store (a
directory, a Redis namespace, or both)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .app import cache_app, store_location
from .options import table_options
from .sizes import parse_bytes

if TYPE_CHECKING:
    from ..store.disk import DiskStore
    from ..store.redis import RedisStore


@contextmanager
def _opened(store: str | None) -> Iterator[list[DiskStore | RedisStore]]:
    """The tiers `store` names; where one cannot be read, at opening or mid-command, a clear
    message and exit code 1 instead of a traceback."""
    import sqlite3

    from ..store.disk import DiskStore
    from ..store.location import StoreLocations

    locations = StoreLocations.parse(store_location(store))
    tiers: list[DiskStore | RedisStore] = []
    redis_errors: tuple[type[Exception], ...] = ()
    if locations.redis_url is not None:
        from redis.exceptions import RedisError  # redis-py is an extra: imported where a URL asks for it

        redis_errors = (RedisError,)
    try:
        if locations.directory is not None:
            tiers.append(DiskStore(locations.directory))
        if locations.redis_url is not None:
            tiers.append(_redis(locations.redis_url))
        yield tiers
    except (OSError, sqlite3.DatabaseError) as error:
        typer.echo(f"{locations.directory}: {error}; `kvboost-rag cache verify` rebuilds the index", err=True)
        raise typer.Exit(code=1) from error
    except redis_errors as error:
        typer.echo(f"{locations.redis_url}: {error}", err=True)
        raise typer.Exit(code=1) from error
    finally:
        for tier in tiers:
            tier.close()


def _redis(url: str) -> RedisStore:
    from ..store.redis import RedisStore

    tier = RedisStore(url)
    tier.connect()
    return tier


@cache_app.command("stats")
@table_options("store")
def cache_stats(*, options: dict[str, Any]) -> None:
    """What is stored: documents, chunks and bytes per model."""
    with _opened(options.get("store")) as tiers:
        for tier in tiers:
            _print_stats(tier)


def _print_stats(tier: DiskStore | RedisStore) -> None:
    from ..store.disk import DiskStore

    rows = tier.stats()
    typer.echo(f"{tier}")
    typer.echo(f"{'model fingerprint':18} {'documents':>9} {'chunks':>8} {'MiB':>9} {'pinned':>7}")
    for row in rows:
        typer.echo(
            f"{row.fingerprint:18} {row.documents:9} {row.chunks:8} {row.bytes / 2**20:9.1f} {row.pinned_chunks:7}"
        )
    if not rows:
        typer.echo("(empty)")
    if isinstance(tier, DiskStore):
        orphans = tier.orphan_files()
        if orphans:
            typer.echo(f"{orphans} chunk files no index row names (`kvboost-rag cache verify` removes them)")
        if tier.read_only:
            typer.echo("(read-only)")


@cache_app.command("verify")
@table_options("store")
def cache_verify(*, options: dict[str, Any]) -> None:
    """Check the index (rebuilt from the chunk files when damaged or missing) and every chunk;
    corrupted chunks are dropped (and recomputed when next warmed). In Redis, index entries
    naming evicted chunks are removed too."""
    from ..store.disk.recovery import verify_store
    from ..store.location import StoreLocations

    locations = StoreLocations.parse(store_location(options.get("store")))
    dropped = 0
    if locations.directory is not None:
        report = verify_store(locations.directory)
        if report.index_damage:
            typer.echo(
                f"index damaged ({'; '.join(report.index_damage)[:200]}): rebuilt {report.rebuilt_chunks} chunks "
                f"and {report.rebuilt_documents} documents from the files; "
                f"{report.unrecoverable_files} unrecoverable files removed"
            )
        checked = report.verify
        typer.echo(
            f"{locations.directory}: checked {checked.checked} chunks: {len(checked.dropped)} dropped, "
            f"{checked.orphans_removed} stray files removed"
        )
        dropped += len(checked.dropped)
    if locations.redis_url is not None:
        with _opened(locations.redis_url) as (redis_tier,):
            found = redis_tier.verify()
            typer.echo(
                f"{redis_tier}: checked {found.checked} chunks: {len(found.dropped)} dropped, "
                f"{found.postings_removed} index entries of evicted chunks removed"  # type: ignore[union-attr]
            )
            dropped += len(found.dropped)
    if dropped:
        raise typer.Exit(code=1)


@cache_app.command("prune")
@table_options("store")
def cache_prune(
    budget: Annotated[str, typer.Option(help="keep at most this much, e.g. 2GiB")],
    *,
    options: dict[str, Any],
) -> None:
    """Evict least recently used, unpinned chunks until the store fits the budget."""
    limit = parse_bytes(budget)
    with _opened(options.get("store")) as tiers:
        for tier in tiers:
            evicted = tier.prune(limit)
            typer.echo(f"{tier}: evicted {evicted} chunks; {tier.total_bytes() / 2**20:.1f} MiB stored")
