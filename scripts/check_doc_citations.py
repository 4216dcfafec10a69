#!/usr/bin/env python3
"""Checks a document's code citations: every `path:line` (`symbol`) must name a file of
the repository, a line inside it, and that line must contain the symbol's text. A
citation left unresolved in a draft's `[[path#symbol]]` form counts as stale too.

    scripts/check_doc_citations.py docs/one-step.md [more.md ...]

Exits 1 with one line per stale citation, 0 when all hold (and prints how many)."""
import pathlib
import re
import sys

CITATION = re.compile(r"`([A-Za-z0-9_./-]+):(\d+)` \(`([^`]+)`\)")
UNRESOLVED = re.compile(r"\[\[[^\n]*?\]\]")


def check(root: pathlib.Path, document: pathlib.Path) -> tuple[int, list[str]]:
    problems, count = [], 0
    for number, text in enumerate(document.read_text().splitlines(), 1):
        for match in UNRESOLVED.finditer(text):
            count += 1
            problems.append(f"{document}:{number}: unresolved citation {match.group(0)}")
        for match in CITATION.finditer(text):
            count += 1
            path, line, symbol = match.group(1), int(match.group(2)), match.group(3)
            where = f"{document}:{number}: {path}:{line}"
            target = root / path
            if not target.is_file():
                problems.append(f"{where}: no such file")
                continue
            lines = target.read_text().splitlines()
            if not 1 <= line <= len(lines):
                problems.append(f"{where}: the file has {len(lines)} lines")
            elif symbol not in lines[line - 1]:
                problems.append(f"{where}: line does not contain '{symbol}'")
    return count, problems


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    total, failures = 0, []
    for name in sys.argv[1:]:
        count, problems = check(root, root / name)
        total += count
        failures += problems
    for problem in failures:
        print(problem)
    if total == 0:
        print("no citations found: the format is `path:line` (`symbol`)")
        return 1
    print(f"{total} citations, {len(failures)} stale")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
