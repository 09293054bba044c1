"""The READMEs' tables, rendered from benchmarks/results (see `readme`)."""

from .readme import HEADLINE_BEGIN, HEADLINE_END, render_all, render_headline, replace_section

__all__ = ["HEADLINE_BEGIN", "HEADLINE_END", "render_all", "render_headline", "replace_section"]
