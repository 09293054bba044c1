"""Package names imported on first use (PEP 562 module `__getattr__`).

torch and transformers take seconds to import; a package that re-exported its modules eagerly
would make `import kvboost_rag`, `kvboost-rag --help` and `kvboost-rag cache stats` pay that too.
Each package lists its names here instead and imports them for type checkers only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: name -> the (relative) module that defines it,
    imported when the name is first read and then kept on the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # read once: later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
