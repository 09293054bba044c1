"""How long a first look takes: `kvboost-rag eval --limit 3 --k 3`, as a user runs it, split into
the model's load and the work after it (issue 52's target: under 30 s beyond the load).

Each run is a fresh process with an empty embedding cache (KVBOOST_RAG_CACHE_DIR pointed at a new
folder, the converted model linked in from the user cache so it is not converted again): what a
first run on a fresh machine pays. The stages are read off the command's own stage lines on
stderr as they appear ("loading the model", "retrieving ..."), so the split is the user's wall
clock, not the eval's own timers. `--repeat` runs; medians reported.

JSON: benchmarks/results/eval_first_look.json (or --out).
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
from kvboost_rag.paths import cache_dir

RESULTS = Path(__file__).resolve().parent / "results"


def one_run(limit: int, k: int) -> dict[str, float]:
    """Seconds to the model loaded, after it, and in all, of one fresh `kvboost-rag eval`."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "cache").mkdir()
        (root / "cache" / "models").symlink_to(cache_dir() / "models")  # converted once, as on a used machine
        env = {**os.environ, "KVBOOST_RAG_CACHE_DIR": str(root / "cache")}
        script = Path(sys.executable).with_name("kvboost-rag")
        argv = [str(script), "eval", "--limit", str(limit), "--k", str(k), "--out", str(root / "out")]
        started = time.perf_counter()
        process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        loaded = None
        assert process.stderr is not None
        for line in process.stderr:  # stage lines and progress bars, as they come
            if loaded is None and line.startswith("retrieving"):
                loaded = time.perf_counter()
        out = process.stdout.read() if process.stdout else ""
        if process.wait() != 0 or loaded is None:
            raise SystemExit(f"{' '.join(argv)} failed ({process.returncode}):\n{out[-2000:]}")
        total = time.perf_counter() - started
        return {"load_s": loaded - started, "after_load_s": total - (loaded - started), "total_s": total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "eval_first_look.json")
    args = p.parse_args()
    runs = [one_run(args.limit, args.k) for _ in range(args.repeat)]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"kvboost-rag eval --limit {args.limit} --k {args.k}, a fresh process, empty embedding cache")
    print("| | to the model loaded | after it | in all |")
    print("|---|---|---|---|")
    load, after, total = (medians[key] for key in ("load_s", "after_load_s", "total_s"))
    print(f"| median of {len(runs)} (s) | {load:.1f} | {after:.1f} | {total:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = {"run": run_info(), "settings": vars(args) | {"out": str(args.out)}, "runs": runs, "medians": medians}
    args.out.write_text(json.dumps(data, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
