"""The `kvboost-rag` command line: warm, cache and eval, one module each."""

from . import cache, evaluate, warm  # noqa: F401 - each registers its commands
from .app import app

__all__ = ["app"]
