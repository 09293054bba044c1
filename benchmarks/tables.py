"""Render every result in benchmarks/results as Markdown tables (kvboost_lab.tables).

Prints them; `--write` puts them in benchmarks/README.md between its tables markers, and
`--check` fails when that section is out of date with the JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvboost_lab.tables import HEADLINE_BEGIN, HEADLINE_END, render_all, render_headline, replace_section

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--readme", type=Path, default=HERE / "README.md")
    p.add_argument("--headline", type=Path, default=HERE.parent / "README.md", help="the README with the headline")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="regenerate the README's generated section")
    action.add_argument("--check", action="store_true", help="exit 1 if the README's section is out of date")
    args = p.parse_args()
    generated = render_all(args.results)
    if not (args.write or args.check):
        print(generated)
        return 0
    sections = [
        (args.readme, lambda text: replace_section(text, generated)),
        (
            args.headline,
            lambda text: replace_section(text, render_headline(args.results), HEADLINE_BEGIN, HEADLINE_END),
        ),
    ]
    stale = 0
    for readme, render in sections:
        text = readme.read_text()
        updated = render(text)
        if args.check:
            if updated != text:
                print(f"{readme} is out of date: run python benchmarks/tables.py --write", file=sys.stderr)
                stale += 1
        else:
            readme.write_text(updated)
            print(f"wrote {readme}")
    return int(stale > 0)


if __name__ == "__main__":
    sys.exit(main())
