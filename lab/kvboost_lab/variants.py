"""The eval's research variants: the product's registry (`kvboost_rag.eval.variants`: full,
default, plain) with each technique alone and the repair's alternatives, and the rho sweep.

Every prefill variant runs one technique alone (nothing recomputed after the prefill), so its
row shows what that technique buys; `verify`, `refresh` and `exact` add a step after
CacheBlend's prefill; `nearest` reads documents warmed each after its own nearest (FusionRAG's way,
(N + 1)x the warming work); `sinks` is `default` with each moved run's first tokens always
recomputed, `strangers-as-alone` the default with chunks warmed among documents the prompt lacks
repaired as if warmed alone (the rule before issue 31's seventh pass); `deviation` the default
choosing its tokens by CacheBlend's K deviation, `query` the query-guided repair as measured in
issue 51.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kvboost_rag.config import CHOOSING_STRATEGIES, ExactnessConfig, RepairConfig
from kvboost_rag.eval.variants import VARIANTS, Baseline, Builder, KeptAs, Variant

OFF = ExactnessConfig.off()
SINK_TOKENS = 4  # where a moved run's KV is most wrong: its first tokens were a pass's attention sink
SETTLE_SHARE = 0.5  # the `settle` variant's share, where the baseline settles no near-tie first


def _kept_as(kept: KeptAs) -> Builder:
    """The default reading chunks kept `kept` (issue 55: the store's KV at rest)."""
    dense = " (as computed)" if kept == "dense" else ""
    return Builder(
        f"the engine as configured, its chunks kept {kept}{dense}",
        lambda b: Variant(kept, "reuse", b.repair, b.exactness, kept_as=kept),
    )


RESEARCH_VARIANTS: dict[str, Builder] = {
    **VARIANTS,
    "prefix": Builder("prefix caching: reuse up to the first difference", lambda b: Variant("prefix", "prefix")),
    "none": Builder(
        "reused KV, nothing recomputed", lambda b: Variant("none", "reuse", RepairConfig(strategy="none"), OFF)
    ),
    "boundary": Builder(
        "recompute each moved run's first tokens (EPIC)",
        lambda b: Variant(
            "boundary", "reuse", RepairConfig(strategy="boundary", boundary_tokens=b.repair.boundary_tokens), OFF
        ),
    ),
    "boundary32": Builder(  # EPIC's upper setting
        "boundary with 32 tokens a run",
        lambda b: Variant("boundary32", "reuse", RepairConfig(strategy="boundary", boundary_tokens=32), OFF),
    ),
    "cacheblend": Builder(
        "CacheBlend alone: recompute the most deviating tokens",
        lambda b: Variant("cacheblend", "reuse", b.cacheblend, OFF),
    ),
    "deviation": Builder(
        "the default, moved tokens chosen by CacheBlend's K deviation at its check layer",
        lambda b: Variant("deviation", "reuse", b.cacheblend, b.exactness),
    ),
    "query": Builder(
        "the query-guided repair (RepairConfig.query_guided(): the question's attention, FusionRAG)",
        lambda b: Variant("query", "reuse", RepairConfig.query_guided(), b.exactness),
    ),
    "nearest": Builder(
        "the engine as configured, documents warmed each after its own nearest",
        lambda b: Variant("nearest", "reuse", b.repair, b.exactness, warming="nearest"),
    ),
    # the store's KV at rest (issue 55): the default reading chunks kept dense, int8 or int4
    **{kept: _kept_as(kept) for kept in ("dense", "int8", "int4")},
    "sinks": Builder(
        "the default, each moved run's first 4 tokens always recomputed (EPIC's sinks)",
        lambda b: Variant("sinks", "reuse", replace(b.repair, blend_boundary_tokens=SINK_TOKENS), b.exactness),
    ),
    "strangers-as-alone": Builder(
        "the default, chunks warmed among documents the prompt lacks repaired as if warmed alone",
        lambda b: Variant("strangers-as-alone", "reuse", replace(b.repair, rho_among_strangers=None), b.exactness),
    ),
    "settle": Builder(
        "the default, a near-tied first token settled by a larger share before the whole prompt",
        lambda b: Variant(
            "settle", "reuse", b.repair, replace(b.exactness, settle_share=b.exactness.settle_share or SETTLE_SHARE)
        ),
    ),
    "whole-prompt-ties": Builder(
        "the default, a near-tied first token settled by recomputing the whole prompt at once",
        lambda b: Variant("whole-prompt-ties", "reuse", b.repair, replace(b.exactness, settle_share=0.0)),
    ),
    # what can follow CacheBlend's prefill: near-ties of every token verified, the prompt
    # refreshed after the first token, and both (the opt-in exact answer)
    "verify": Builder(
        "CacheBlend, near-tied tokens verified on exact KV",
        lambda b: Variant("verify", "reuse", b.cacheblend, replace(_verifying(b), verify_tokens=None)),
    ),
    "refresh": Builder(
        "CacheBlend, prompt recomputed after the first token",
        lambda b: Variant("refresh", "reuse", b.cacheblend, ExactnessConfig(verify_margin=0.0, refresh=True)),
    ),
    "exact": Builder(
        "CacheBlend, verify and refresh: full prefill's answer",
        lambda b: Variant("exact", "reuse", b.cacheblend, replace(_verifying(b), verify_tokens=1, refresh=True)),
    ),
}


def _verifying(baseline: Baseline) -> ExactnessConfig:
    """The baseline's exactness with verification on (at the default margin where it is off)."""
    margin = baseline.exactness.verify_margin or ExactnessConfig().verify_margin
    return replace(baseline.exactness, verify_margin=margin, refresh=False)


SWEPT_CHOICES = CHOOSING_STRATEGIES  # how a swept repair picks its tokens: deviation, the question's attention


def rho_variants(baseline: Baseline, rhos: Iterable[float], choices: Iterable[str] = ("cacheblend",)) -> list[Variant]:
    """Each choice alone (nothing verified after the prefill) at each share, one share for every
    chunk however it was warmed: `<choice>@<rho>`, the frontier's lines."""
    unknown = [c for c in choices if c not in SWEPT_CHOICES]
    if unknown:
        raise ValueError(f"unknown repair choices {unknown}; choose from {list(SWEPT_CHOICES)}")
    flat = dict(rho_after_neighbours=None, rho_among_strangers=None)
    return [
        Variant(f"{choice}@{rho:g}", "reuse", replace(baseline.repair, strategy=choice, rho=rho, **flat), OFF)  # type: ignore[arg-type]
        for choice in choices
        for rho in rhos
    ]
