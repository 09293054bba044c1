"""Which weight format a loaded model runs in: its own floats or int4 groups (`hf.int4_linear`).

"auto" takes int4 where the weights stay the file's: a GGUF whose linear layers are Q4_1
blocks (the embedded default is one), on a CPU, where the int4 decode step measured fastest.
Other models keep their floats unless int4 is asked for: quantizing bf16 weights changes them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .gguf_int4 import q4_1_weights
from .int4_linear import int4_supported, quantize_linear_layers

log = logging.getLogger(__name__)

WEIGHT_FORMATS = ("auto", "int4", "float")


def check_weights(weights: str | None) -> str:
    """The format asked for, "auto" for None; a ValueError for one not known."""
    weights = weights or "auto"
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    return weights


def apply_weights(model: Any, weights: str | None, gguf: Path | None) -> str:
    """Put `model`'s linear layers in the asked format (see the module's docstring); returns the
    one it runs: "int4" or "float"."""
    weights = check_weights(weights)
    if weights == "float":
        return "float"
    reason = int4_supported(model)
    if reason is not None:
        if weights == "int4":
            raise ValueError(reason)
        return "float"
    if weights == "auto" and next(model.parameters()).device.type != "cpu":
        return "float"  # int4 was measured fastest on CPUs; on a GPU it is asked for (`gpu_check`)
    from_file = q4_1_weights(gguf, model.config.get_text_config(decoder=True)) if gguf is not None else {}
    if weights == "auto" and not from_file:
        return "float"
    quantize_linear_layers(model, weights=from_file)
    log.info("int4 linear layers (%s)", "the file's Q4_1 blocks" if from_file else "quantized on load")
    return "int4"
