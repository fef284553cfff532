"""Regenerate dpbert/data/lexicons/{problems,treatments}_bc5cdr.txt from a BC5CDR IOB file.

    python tools/extract_bc5cdr_lexicons.py ../shared/data/ner/bc5cdr/train.tsv
"""
import collections
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "dpbert" / "data" / "lexicons"


def mentions(path):
    counts, current, kind = collections.Counter(), None, None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line and line.split("\t")[1].startswith("I-") and current is not None:
            current.append(line.split("\t")[0])
            continue
        if current:
            counts[(kind, " ".join(current).lower())] += 1
        current = None
        if line and line.split("\t")[1].startswith("B-"):
            token, tag = line.split("\t")
            current, kind = [token], tag[2:]
    if current:
        counts[(kind, " ".join(current).lower())] += 1
    return counts


def main(path):
    counts = mentions(path)
    for kind, name in (("Disease", "problems_bc5cdr.txt"), ("Chemical", "treatments_bc5cdr.txt")):
        items = [(n, m) for (k, m), n in counts.items()
                 if k == kind and m.replace(" ", "").replace("-", "").isalpha() and 3 <= len(m) <= 40]
        items.sort(key=lambda x: (-x[0], x[1]))
        (OUT / name).write_text("\n".join(m for _, m in items[:400]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
