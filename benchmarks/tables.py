"""Render every result in benchmarks/results as Markdown tables (kvboost_rag.eval.tables).

Prints them; `--write` puts them in benchmarks/README.md between its tables markers, and
`--check` fails when that section is out of date with the JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvboost_rag.eval.tables import render_all, replace_section

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--readme", type=Path, default=HERE / "README.md")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="regenerate the README's generated section")
    action.add_argument("--check", action="store_true", help="exit 1 if the README's section is out of date")
    args = p.parse_args()
    generated = render_all(args.results)
    if not (args.write or args.check):
        print(generated)
        return 0
    text = args.readme.read_text()
    updated = replace_section(text, generated)
    if args.check:
        if updated != text:
            print(f"{args.readme} is out of date: run python benchmarks/tables.py --write", file=sys.stderr)
        return int(updated != text)
    args.readme.write_text(updated)
    print(f"wrote {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
