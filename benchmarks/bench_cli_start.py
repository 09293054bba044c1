"""How long `kvboost-rag` takes to answer what needs no model: --help, --version, each command's
--help, `cache stats` (on a store, and on a path that holds none) and a usage error.

Each command runs in a fresh process (as a user runs it), `--repeat` times after one unmeasured
run (the file cache warm), and the median wall clock is reported. Two references frame them: a
bare interpreter, and importing torch and transformers, which every command paid before they were
imported lazily (issue 32); `--before REF` also times `--help` of the package as it was at a git
ref (e.g. the commit before issue 32), run from an exported copy. The load average is recorded:
other work on the machine slows every row.

JSON: benchmarks/results/cli_start.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvboost_rag.eval.run import run_info
from kvboost_rag.store.disk.index import INDEX_FILE, DiskIndex

RESULTS = Path(__file__).resolve().parent / "results"


REPO = Path(__file__).resolve().parent.parent


def export(ref: str, folder: Path) -> Path:
    """The package as it was at `ref`, exported under `folder`: put first on PYTHONPATH."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "kvboost_rag"], capture_output=True, check=True)
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def commands(root: Path) -> dict[str, tuple[list[str], int]]:
    """Name -> (argv, the exit code it must end with)."""
    script = Path(sys.executable).with_name("kvboost-rag")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "kvboost_rag.cli"]
    store = root / "store"
    return {
        "python -c pass (reference)": ([sys.executable, "-c", "pass"], 0),
        "import torch, transformers (reference)": ([sys.executable, "-c", "import torch, transformers"], 0),
        "kvboost-rag --help": ([*cli, "--help"], 0),
        "kvboost-rag --version": ([*cli, "--version"], 0),
        "kvboost-rag warm --help": ([*cli, "warm", "--help"], 0),
        "kvboost-rag eval --help": ([*cli, "eval", "--help"], 0),
        "kvboost-rag serve --help": ([*cli, "serve", "--help"], 0),
        "kvboost-rag cache stats --help": ([*cli, "cache", "stats", "--help"], 0),
        "kvboost-rag cache stats (a store)": ([*cli, "cache", "stats", "--store", str(store)], 0),
        "kvboost-rag cache stats (no store there)": ([*cli, "cache", "stats", "--store", str(root / "typo")], 1),
        "kvboost-rag warm nonexist.txt (usage error)": ([*cli, "warm", str(root / "nonexist.txt")], 2),
    }


def timed(
    argv: list[str], code: int, repeat: int, env: dict[str, str] | None = None, cwd: Path | None = None
) -> list[float]:
    """Wall clock of `repeat` runs, after one unmeasured run."""
    seconds = []
    for i in range(repeat + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
        elapsed = time.perf_counter() - started
        if done.returncode != code:
            raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}, expected {code}\n{done.stderr[-2000:]}")
        if i:
            seconds.append(elapsed)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3, help="measured runs of each command (the median is reported)")
    p.add_argument("--out", type=Path, default=RESULTS / "cli_start.json")
    p.add_argument("--before", metavar="REF", help="also time --help of the package at this git ref")
    args = p.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "store").mkdir()
        DiskIndex(root / "store" / INDEX_FILE).close()  # an empty store: what `cache stats` opens
        load_before = os.getloadavg()
        for name, (argv, code) in commands(root).items():
            seconds = timed(argv, code, args.repeat)
            rows[name] = {"median_s": statistics.median(seconds), "runs_s": seconds}
            print(f"{name:45} {rows[name]['median_s']:6.2f} s", flush=True)
        if args.before:
            before = export(args.before, root / "before")  # run from there: `-m` puts the cwd first on sys.path
            env = {**os.environ, "PYTHONPATH": str(before)}
            seconds = timed([sys.executable, "-m", "kvboost_rag.cli", "--help"], 0, args.repeat, env, before)
            name = f"kvboost-rag --help at {args.before} (before)"
            rows[name] = {"median_s": statistics.median(seconds), "runs_s": seconds}
            print(f"{name:45} {rows[name]['median_s']:6.2f} s", flush=True)
    load = {"before": load_before, "after": os.getloadavg()}
    report = {"rows": rows, "repeat": args.repeat, "before": args.before, "load_average": load}
    print(f"\nload average (1, 5, 15 min) before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**report, "run": run_info()}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
