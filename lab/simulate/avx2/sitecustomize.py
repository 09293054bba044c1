"""Runs a process as an AVX2-only host sees it (`make test-as-avx2`): torch's own oneDNN bf16 check,
which `kvboost_rag.hf.cpu.onednn_bf16` asks, answers False, so the engine takes float32 and packs
nothing. With ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 the kernels are AVX2's too.
Every process started with this folder on PYTHONPATH (the CLI and server subprocesses of the
tests included) gets it."""

import torch

torch.ops.mkldnn._is_mkldnn_bf16_supported = lambda: False
