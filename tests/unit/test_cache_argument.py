"""The cache reaches a model's forward by the name its transformers version gives it."""

from __future__ import annotations

from typing import Any

from transformers import DynamicCache

from kvboost_rag.hf.cache import cache_argument


class Before:  # transformers 5.0-5.1x: `cache=` would land in **kwargs, unused
    def forward(self, input_ids: Any = None, past_key_values: Any = None, **kwargs: Any) -> None: ...


class After:  # transformers 5.2x on
    def forward(self, input_ids: Any = None, cache: Any = None, **kwargs: Any) -> None: ...


def test_the_cache_goes_by_the_name_the_forward_takes() -> None:
    cache = DynamicCache()
    assert cache_argument(Before(), cache) == {"past_key_values": cache}
    assert cache_argument(After(), cache) == {"cache": cache}
