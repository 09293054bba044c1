"""What every framework integration shares, kept here so the packages stay thin.

The core never imports a framework: these take plain strings from the integration packages.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeAlias, runtime_checkable

from ..engine import KVBoostRAG, WarmReport
from ..environment import default_engine
from ..neighbours import DEFAULT_NEIGHBOURS, groups_among

RETRIEVED_TOGETHER = "retrieved together"  # what a chunk records of neighbours a retriever returned with it
# From this many documents, warming takes long enough (seconds each on CPU) to deserve a bar.
PROGRESS_FROM = 10


@runtime_checkable
class HoldsEngine(Protocol):
    """What a framework model gives its engine by: `ChatKVBoost`, either `KVBoostLLM`."""

    def get_engine(self) -> KVBoostRAG: ...


# What a warming entry point takes: the engine, a framework model holding one, or None: the
# process's default engine, the one `ChatKVBoost()` / `KVBoostLLM()` with no options load.
WarmTarget: TypeAlias = "KVBoostRAG | HoldsEngine | None"


def check_warm_target(target: object, what: str = "warming") -> None:
    """Refuse at once what cannot warm: a wrong argument must not turn warming into a silent no-op
    (a warning per document and nothing warmed), which "warming never fails" does not cover."""
    if target is None or (isinstance(target, (KVBoostRAG, HoldsEngine)) and not isinstance(target, type)):
        return  # (a class has get_engine too: `ChatKVBoost` where `ChatKVBoost()` was meant is refused)
    raise TypeError(
        f"{what} needs a KVBoostRAG engine, a model that holds one (ChatKVBoost, KVBoostLLM) or None "
        f"(the default engine); got {type(target).__name__}"
    )


def engine_of(target: object, what: str = "warming") -> KVBoostRAG:
    """The engine a warming target stands for (loads the model where it is not loaded yet)."""
    check_warm_target(target, what)
    if target is None:
        return default_engine()
    if isinstance(target, KVBoostRAG):
        return target
    engine = target.get_engine()  # type: ignore[attr-defined]
    if not isinstance(engine, KVBoostRAG):
        raise TypeError(f"{type(target).__name__}.get_engine() gave {type(engine).__name__}, not a KVBoostRAG")
    return engine


def retrieved_together(texts: Sequence[str], count: int | None = None) -> Callable[[str], list[str]]:
    """Each text's neighbours among texts a retriever returned together (best first): the
    `count` (default DEFAULT_NEIGHBOURS) best-ranked others, nearest last as they stand before it.
    Documents retrieved for one query are the ones a prompt puts around each other, so no index
    search is needed to find them."""
    count = DEFAULT_NEIGHBOURS if count is None else count
    ranked = list(dict.fromkeys(t for t in texts if t.strip()))
    return lambda text: [t for t in ranked if t != text][:count][::-1]


def warm_quietly(
    target: WarmTarget,
    texts: Iterable[str],
    neighbours: Callable[[str], Sequence[str]] | None = None,
    neighbours_from: str = RETRIEVED_TOGETHER,
    show_progress: bool | None = None,
    pin: bool = False,
) -> WarmReport:
    """Warm the texts; one that fails becomes a warning, not an error.

    Hooks call this inside the user's pipeline (retrieval, ingestion), which warming must never
    fail, and one bad document must not cost the others their warming: a document that cannot be
    warmed is simply computed when a prompt holds it. `neighbours(text)`: its nearest documents
    from the user's index (FusionRAG); the texts are then warmed in groups of mutual neighbours,
    two passes a group (`KVBoostRAG.warm_together`): each after half its group or more, for ~2x
    plain warming's work; `neighbours_from`: how they were found, recorded with the chunks.
    Without, each text alone. `show_progress`: a tqdm bar on stderr, since warming many
    documents takes minutes that would otherwise pass without a sign; None shows one from
    `PROGRESS_FROM` documents. `target` (`engine_of`) and the texts are checked first: a wrong
    argument is a TypeError, not a warning per document.
    """
    started = time.perf_counter()
    check_warm_target(target)
    total = WarmReport()
    texts = list(texts)
    wrong = next((text for text in texts if not isinstance(text, str)), None)
    if wrong is not None:
        raise TypeError(f"warming takes documents' text (str), got {type(wrong).__name__}")
    texts = [text for text in texts if text.strip()]
    if not texts:
        return total  # nothing to warm: no model to load
    engine = engine_of(target)
    groups = groups_among(texts, neighbours) if neighbours is not None else [[text] for text in texts]
    for group in _progress(groups, show_progress, len(texts)):
        try:
            if len(group) > 1:
                report = engine.warm_together([group], neighbours_from=neighbours_from, pin=pin)
            else:
                report = engine.warm(group[0], pin=pin)
        except Exception as error:  # noqa: BLE001 - never fail the user's chain
            if len(group) > 1:  # one bad member: the others are warmed alone
                report = warm_quietly(engine, group, None, show_progress=False, pin=pin)
            else:
                warnings.warn(f"kvboost-rag could not warm a document: {error}", stacklevel=3)
                continue
        total.add(report)
    total.seconds = time.perf_counter() - started
    return total


def _progress(groups: list[list[str]], show: bool | None, documents: int) -> Iterable[list[str]]:
    """The groups, through a progress bar where one is asked for (None: where there are many documents)."""
    if show is False or (show is None and documents < PROGRESS_FROM):
        return groups
    from tqdm.auto import tqdm

    return tqdm(groups, desc="kvboost-rag warming", unit="group" if documents > len(groups) else "doc")
