#!/usr/bin/env python3
"""Checks a document's code citations: every `path:line` (`symbol`) must name a file of
the repository, a line inside it, and that line must contain the symbol's text. A
citation left unresolved in a draft's `[[path#symbol]]` form counts as stale too.

    scripts/check_doc_citations.py docs/one-step.md [more.md ...]

With --paths, checks instead that every repository path named anywhere in the
repository's sources, scripts and Markdown (comments included) exists:

    scripts/check_doc_citations.py --paths

A path from the root (nn/cuda/linear.cu, docs/, ...) must exist from the root; another
path ending in a source or document extension must exist from the directory of the file
that names it or from one above it. Headers generated at configure time
(include/seqpar/config.h, from config.h.in) count as present.

Exits 1 with one line per stale citation or path, 0 when all hold (and prints how many)."""
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


# Where --paths looks, and what it passes over: build trees, vendored code, and the
# measurement logs of bench/results/, which record the tree as it was when they ran.
SCANNED_SUFFIXES = {".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".cmake", ".md", ".in"}
SKIPPED = ("third_party/", "bench/results/", "tests/fuzz/corpus/")
SOURCE_EXTENSIONS = r"(?:h|cpp|cu|cuh|py|sh|md|cmake|toml|yaml|json|txt|csv|log|gz|in)"
# A path not from the root is checked only with these (its own sources and documents;
# outputs such as rank-notes.txt are named relative to a run's directory).
RELATIVE_EXTENSIONS = r"(?:h|cpp|cu|cuh|py|sh|md|cmake)"
PATH = re.compile(r"(?<![\w./:~<$@{*-])((?:[A-Za-z0-9_.-]+/)+(?:[A-Za-z0-9_.-]+\." + SOURCE_EXTENSIONS
                  + r"\b|(?=[\s`'\"),;:]|$)))")
# Paths that name other projects' files or an installed tree, not this repository's.
ELSEWHERE = ("sequence/", "lib/cmake/", "lib/pkgconfig/", "deepspeed/", "torch/", "bench-out/")


def scanned_files(root: pathlib.Path):
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(SKIPPED) or any(part.startswith((".", "build")) for part in path.relative_to(root).parts):
            continue
        if path.is_file() and (path.suffix in SCANNED_SUFFIXES or path.name == "CMakeLists.txt"):
            yield path


def present(root: pathlib.Path, where: pathlib.Path, named: str, top_level: set[str]) -> bool:
    if named.startswith("include/seqpar/") or named.startswith("seqpar/"):
        inside = named.split("seqpar/", 1)[1]
        generated = root / "include" / "seqpar" / (inside + ".in")
        return generated.exists() or (root / "include" / "seqpar" / inside).exists() or (root / inside).exists()
    if named.split("/")[0] in top_level:
        return (root / named).exists() or (where / named).exists()
    directory = where
    while True:
        if (directory / named).exists():
            return True
        if directory == root:
            return False
        directory = directory.parent


def check_paths(root: pathlib.Path) -> tuple[int, list[str]]:
    top_level = {entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(".")}
    problems, count = [], 0
    for path in scanned_files(root):
        for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in PATH.finditer(text):
                named = match.group(1).rstrip(".")
                if named.startswith(ELSEWHERE) or re.search(r"(^|/)[A-Z][A-Z_]*(\.|/|$)", named):
                    continue  # another project's file, or a placeholder (configs/NAME.toml)
                rooted = named.split("/")[0] in top_level
                if not rooted and not re.search(r"\." + RELATIVE_EXTENSIONS + r"$", named):
                    continue  # a directory named relative to somewhere: too vague to check
                count += 1
                if not present(root, path.parent, named, top_level):
                    problems.append(f"{path.relative_to(root)}:{number}: no such path {named}")
    return count, problems


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    if sys.argv[1:] == ["--paths"]:
        count, problems = check_paths(root)
        for problem in problems:
            print(problem)
        print(f"{count} repository paths named, {len(problems)} missing")
        return 1 if problems or count == 0 else 0
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
