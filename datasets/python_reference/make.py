"""Write `python-reference.jsonl.gz`: a second corpus, unlike Wikipedia, for the eval's
`--others-from` (documents from two corpora in one prompt).

The passages are the Python language reference's topics as the standard library ships them
(`pydoc_data.topics`, what `help("assert")` prints), cut into ~100-word passages as DPR cut
Wikipedia. Records take NQ-Open's shape with no question: one passage each in `ctxs`.
Run once, with the Python that wrote the shipped file (the topics change between versions):
    python datasets/python_reference/make.py
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from pydoc_data.topics import topics

WORDS_PER_PASSAGE = 100


def passages(text: str, size: int = WORDS_PER_PASSAGE) -> list[str]:
    words = text.split()
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size) if len(words[i : i + size]) >= size // 4]


def main() -> None:
    out = Path(__file__).with_name("python-reference.jsonl.gz")
    records = [
        {"question": "", "answers": [], "ctxs": [{"title": f"Python reference: {name}", "text": text}]}
        for name in sorted(topics)
        for text in passages(topics[name])
    ]
    # mtime=0: the same topics give the same bytes
    with gzip.GzipFile(out, "wb", mtime=0) as file:
        file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode())
    print(f"{len(records)} passages from {len(topics)} topics (Python {sys.version.split()[0]}) -> {out}")


if __name__ == "__main__":
    main()
