"""Runs a process as an AVX2-only host sees it (`make test-as-avx2`): torch's own oneDNN bf16 check,
which `kvboost_rag.hf.cpu.onednn_bf16` asks, answers False, so the engine takes float32 and packs
nothing. With ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 the kernels are AVX2's too.
Every process started with this folder on PYTHONPATH (the CLI and server subprocesses of the
tests included) gets it. The check is replaced once torch is imported, not before: a process that
never imports torch (the CLI's help, cache stats) must not import it here either."""

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any


class _AnswersNo:
    """The check, answering False; shaped as an operator packet enough for code that walks
    `torch.ops` reading each overload (torchao at import: `op.default`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        return False

    def __getattr__(self, overload: str) -> "_AnswersNo":
        if overload.startswith("__"):
            raise AttributeError(overload)
        return self


class _AnswerNoOnceTorchLoads(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module.ops.mkldnn._is_mkldnn_bf16_supported = _AnswersNo()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AnswerNoOnceTorchLoads())
