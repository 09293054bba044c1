"""The eval's variants: a registry of names, each one way of serving the same prompts.

The product's three: `full` (full prefill, the reference), `default` (the engine as its settings
stand, on documents warmed as `kvboost-rag warm` warms them: in groups of mutual neighbours) and
`plain` (the same on documents warmed alone). The research variants (each technique alone, the
repair's alternatives, the rho sweep) extend this registry in the lab (`kvboost_lab.variants`,
`kvboost-lab eval`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from ..config import ExactnessConfig, Mode, Quantization, RepairConfig

# How the documents a variant reads were warmed: as the eval's corpus is (as `kvboost-rag warm`
# warms: in groups of mutual neighbours), each alone, or each after its own nearest; each other
# than "corpus" is a store of its own.
Warming = Literal["corpus", "alone", "nearest"]
# How the store a variant reads keeps its KV: as the engine's settings say, or one format
# (dense: as computed); each other than the engine's is a store of its own.
KeptAs = Literal["engine", "dense"] | Quantization


@dataclass(slots=True, frozen=True)
class Variant:
    name: str
    mode: Mode
    repair: RepairConfig | None = None  # None: the engine's
    exactness: ExactnessConfig | None = None  # None: the engine's
    warming: Warming = "corpus"
    kept_as: KeptAs = "engine"


@dataclass(slots=True, frozen=True)
class Baseline:
    """The settings variants derive from: the engine's repair (made CacheBlend's where it is
    another strategy) and exactness policy, with the eval's command-line changes."""

    repair: RepairConfig
    exactness: ExactnessConfig

    @property
    def cacheblend(self) -> RepairConfig:
        """The baseline's repair, choosing by CacheBlend's K deviation."""
        return replace(self.repair, strategy="cacheblend")


@dataclass(slots=True, frozen=True)
class Builder:
    """A variant's one-line description beside how it is built: `--help` lists the registry
    itself, so the help never drifts from what the names run."""

    about: str
    build: Callable[[Baseline], Variant]

    def __call__(self, baseline: Baseline) -> Variant:
        return self.build(baseline)


VARIANTS: dict[str, Builder] = {
    "full": Builder("full prefill, the reference", lambda b: Variant("full", "full")),
    "default": Builder(
        "the engine as configured, documents warmed as kvboost-rag warm does (groups of neighbours)",
        lambda b: Variant("default", "reuse", b.repair, b.exactness),
    ),
    "plain": Builder(
        "the engine as configured, documents warmed alone",
        lambda b: Variant("plain", "reuse", b.repair, b.exactness, warming="alone"),
    ),
}


# What a user decides between (reuse as configured, with and without neighbours, against full
# prefill), sized for a CPU: each variant answers every question once more.
DEFAULT_VARIANTS = ("full", "default", "plain")


def described(registry: Mapping[str, Builder] = VARIANTS) -> str:
    """Every variant's name and description, a line each, for `--help`."""
    width = max(map(len, registry))
    return "\n".join(f"{name:<{width}}  {builder.about}" for name, builder in registry.items())


def variants(names: Iterable[str], baseline: Baseline, registry: Mapping[str, Builder] = VARIANTS) -> list[Variant]:
    """`full` first (every other is measured against it), then the named ones in order."""
    names = [n for n in dict.fromkeys(names) if n != "full"]
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {sorted(registry)}")
    return [registry[name](baseline) for name in ["full", *names]]
