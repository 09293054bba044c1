"""The `kvboost-rag` command line: warm, cache, eval and serve, one module each."""

from . import cache, evaluate, serve, warm  # noqa: F401 - each registers its commands
from .app import app

__all__ = ["app"]
