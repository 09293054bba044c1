"""Which models position-independent reuse can serve correctly, decided from the config alone.

Reuse moves cached keys to new positions by rotating them; that is exact only for rotary
position encodings whose angle is linear in the position. Anything else is refused before any
weight is loaded.
"""

from __future__ import annotations

from typing import Any

ALIBI_MODEL_TYPES = {"bloom", "mpt", "baichuan"}
ABSOLUTE_POSITION_MODEL_TYPES = {"gpt2", "gpt_neo", "opt", "gpt_bigcode", "xglm", "biogpt"}
# Rotary over interleaved pairs, where our re-rotation assumes rotate-half.
INTERLEAVED_ROPE_MODEL_TYPES = {"gptj", "codegen", "chatglm", "glm"}
# Angle linear in position (rotations compose); yarn's magnitude factor is divided out.
ROPE_TYPES_SUPPORTED = {"default", "linear", "llama3", "yarn"}


class UnsupportedModelError(ValueError):
    """The model cannot be served with position-independent reuse."""


def rope_parameters(config: Any) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def unsupported_reason(config: Any) -> str | None:
    """Why reuse would be wrong for this config, or None when it is served correctly."""
    model_type = getattr(config, "model_type", "unknown")
    if model_type in ALIBI_MODEL_TYPES or getattr(config, "alibi", False) or _mpt_alibi(config):
        return "it uses ALiBi attention biases, not rotary position embeddings"
    if model_type in ABSOLUTE_POSITION_MODEL_TYPES:
        return "it uses learned absolute position embeddings, which cached keys cannot be moved out of"
    if model_type in INTERLEAVED_ROPE_MODEL_TYPES:
        return "it rotates interleaved pairs of dimensions, which the re-rotation does not handle"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    layer_types = getattr(config, "layer_types", None) or []
    if any("sliding" in str(t) or "chunked" in str(t) for t in layer_types):
        return "some of its layers use sliding-window or chunked attention"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        return f"it uses sliding-window attention (window {window})"
    rope_type = rope_parameters(config).get("rope_type", rope_parameters(config).get("type", "default"))
    if rope_type not in ROPE_TYPES_SUPPORTED:
        return f"its rope scaling {rope_type!r} depends on the sequence length, so rotations do not compose"
    if not _has_rope(config):
        return "it has no rotary position embeddings"
    return None


def _mpt_alibi(config: Any) -> bool:
    attn_config = getattr(config, "attn_config", None)
    if attn_config is None:
        return False
    return bool(attn_config.get("alibi") if isinstance(attn_config, dict) else getattr(attn_config, "alibi", False))


def _has_rope(config: Any) -> bool:
    return bool(rope_parameters(config)) or getattr(config, "rope_theta", None) is not None


def unsupported_error(config: Any, name: str, reason: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"model {name!r} ({getattr(config, 'model_type', 'unknown')}) cannot use position-independent KV "
        f"reuse: {reason}. Pass allow_unsupported=True to run it with reuse off (modes 'full' and 'prefix')."
    )
