#!/usr/bin/env python3
"""Print the largest modules and functions of the source tree; check the size rule.

The rule (issue 26, docs/layout.md): modules are split by meaning, never to meet
a number. The numbers only ask a question: a module over ~400 lines, or a
function over ~60, is named as a warning (does it hold two things?); a module
over ~700 lines or a function over ~80 fails the check (it does). In `api/`,
`operator/`, `agent/`, `sim/` and `hack/`; tests and generated files aside.

Sizes are physical lines: a module counts every line of its file (what `wc -l`
prints); a function counts from its `def` line to its last line (`ast`'s `lineno`
to `end_lineno`, decorators left out), docstring and comments included. A
function nested in another, or a method, is measured on its own and also counts
towards its enclosing function. A file is generated when one of its first five
lines carries the common marker `Code generated ... DO NOT EDIT`.

Usage:
    hack/sizes.py [--report | --check] [--top N] [--warn-module L] [--max-module L]
                  [--warn-function L] [--max-function L] [PATH ...]

Exit status: 0 in report mode, and in check mode when nothing is over a failing
limit (what is over a warning limit is named on stderr, `sizes: warning: ...`);
1 in check mode when something is over a failing limit (each one named on
stderr); 2 when a file cannot be parsed (the file and the parser's message on
stderr).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("api", "operator", "agent", "sim", "hack")
WARN_MODULE_LINES = 400
MAX_MODULE_LINES = 700
WARN_FUNCTION_LINES = 60
MAX_FUNCTION_LINES = 80
# Directories never walked: tests are exempt from the rule; the rest is not source.
SKIP_DIRS = {"tests", "__pycache__", "build", "dist", "node_modules"}
GENERATED = re.compile(r"Code generated .*DO NOT EDIT")


@dataclass(frozen=True)
class Size:
    """One measured thing: `lines` physical lines of `name` (a path, or path:qualname)."""

    lines: int
    name: str


def source_files(paths: list[Path]) -> list[Path]:
    """Python files under `paths` (files or directories), sorted, tests and hidden dirs skipped."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
            continue
        for directory, subdirs, files in os.walk(path):
            subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")]
            found.extend(Path(directory) / f for f in files if f.endswith(".py"))
    return sorted(found)


def is_generated(text: str) -> bool:
    """True when one of the first five lines of `text` carries the generated-code marker."""
    return any(GENERATED.search(line) for line in text.splitlines()[:5])


def _functions(tree: ast.AST, prefix: str) -> list[Size]:
    """Every function and method under `tree`, named `prefix` + their dotted qualname."""
    sizes: list[Size] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            sizes.append(Size(end - node.lineno + 1, f"{prefix}{node.name}"))
            sizes.extend(_functions(node, f"{prefix}{node.name}.<locals>."))
        elif isinstance(node, ast.ClassDef):
            sizes.extend(_functions(node, f"{prefix}{node.name}."))
        else:
            sizes.extend(_functions(node, prefix))
    return sizes


def measure(files: list[Path], base: Path) -> tuple[list[Size], list[Size]]:
    """Sizes of the modules and of the functions in `files`, names relative to `base`.

    Raises SyntaxError (its filename set) when a file does not parse.
    """
    modules: list[Size] = []
    functions: list[Size] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if is_generated(text):
            continue
        name = str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
        tree = ast.parse(text, filename=name)
        modules.append(Size(len(text.splitlines()), name))
        functions.extend(_functions(tree, f"{name}:"))
    return modules, functions


def _largest(sizes: list[Size], top: int) -> list[Size]:
    return sorted(sizes, key=lambda s: (-s.lines, s.name))[:top]


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, print the report, and in check mode return 1 when a limit is passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="print the largest only (the default)")
    mode.add_argument("--check", action="store_true", help="also fail naming everything over a limit")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="how many of each to print (default 10)")
    parser.add_argument("--warn-module", type=int, default=WARN_MODULE_LINES, metavar="L")
    parser.add_argument("--max-module", type=int, default=MAX_MODULE_LINES, metavar="L")
    parser.add_argument("--warn-function", type=int, default=WARN_FUNCTION_LINES, metavar="L")
    parser.add_argument("--max-function", type=int, default=MAX_FUNCTION_LINES, metavar="L")
    parser.add_argument("paths", nargs="*", type=Path, help=f"files or directories (default: {' '.join(ROOTS)})")
    args = parser.parse_args(argv)

    paths = args.paths or [REPO / root for root in ROOTS]
    try:
        modules, functions = measure(source_files(paths), REPO)
    except SyntaxError as err:
        print(f"sizes: cannot parse {err.filename}:{err.lineno}: {err.msg}", file=sys.stderr)
        return 2

    print(f"largest modules (warning {args.warn_module}, limit {args.max_module} lines, {len(modules)} modules):")
    for size in _largest(modules, args.top):
        print(f"  {size.lines:5d}  {size.name}")
    print(f"largest functions (warning {args.warn_function}, limit {args.max_function} lines, "
          f"{len(functions)} functions):")
    for size in _largest(functions, args.top):
        print(f"  {size.lines:5d}  {size.name}")
    if not args.check:
        return 0

    over, warned = [], []
    for kind, measured, warn, limit in (
        ("module", modules, args.warn_module, args.max_module),
        ("function", functions, args.warn_function, args.max_function),
    ):
        for size in _largest(measured, len(measured)):
            if size.lines > limit:
                over.append(f"sizes: {kind} {size.name} has {size.lines} lines, over the limit of {limit}")
            elif size.lines > warn:
                warned.append(f"sizes: warning: {kind} {size.name} has {size.lines} lines, over {warn}: "
                              "does it hold two things?")
    for line in warned + over:
        print(line, file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
