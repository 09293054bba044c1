"""Where and how a result was measured, recorded in every eval and benchmark JSON: timings only
compare within one machine and commit."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..hf.cpu import onednn_bf16

SOURCE = Path(__file__).resolve().parents[2]  # the checkout, where installed from one


def run_info() -> dict[str, Any]:
    """Where and how a result was measured: timings only compare within one machine and commit."""
    flags = _cpuinfo("flags").split()
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "commit": _git_commit(),
        "platform": platform.platform(),
        "cpu": _cpuinfo("model name") or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "native_bf16": onednn_bf16(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def _cpuinfo(field: str) -> str:
    path = Path("/proc/cpuinfo")
    found = re.search(rf"^{field}\s*:\s*(.*)$", path.read_text(), re.MULTILINE) if path.exists() else None
    return found.group(1).strip() if found else ""


def _git_commit() -> str | None:
    """HEAD's short hash, with "+dirty" when tracked files differ from it."""

    def git(*command: str) -> str:
        return subprocess.run(["git", *command], cwd=SOURCE, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None
