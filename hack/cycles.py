#!/usr/bin/env python3
"""Fail on any import circle among the product's and the simulators' modules (issue 26).

import-linter checks the layers of `pyproject.toml` but finds no circle inside
a layer. This builds the import graph with grimp (import-linter's own graph
library), imports under `if TYPE_CHECKING:` included (a type-only circle still
says two modules hold one thing, or that a thing sits in the wrong one), and
prints every strongly connected component of two or more modules (Tarjan's
algorithm), with the imports that close it (file:line).

Usage:
    hack/cycles.py [PACKAGE ...]      (default: the packages of PACKAGES, below)

Exit status: 0 without circles but those of KNOWN; 1 with any other (each named
on stderr), or when a circle of KNOWN is gone (then strike it from the list).
"""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("vramguard_api", "vramguard_operator", "vramguard_agent", "vramguard_sim")
KNOWN: tuple[frozenset[str], ...] = (
    # Type-only circles in files being moved by issue 26's other parts (the
    # laboratory to sim/, the planner to plan/); each is to go, not to grow.
    frozenset({"vramguard_sim.fakenvml", "vramguard_sim.fakenvml_limits"}),
    frozenset({"vramguard_sim.simulate.control", "vramguard_sim.simulate.triggers"}),
    frozenset({"vramguard_sim.simulate.fleet", "vramguard_sim.simulate.nodes"}),
)
"""Circles tolerated for now, each exactly as it is: one that grows or changes fails."""


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two modules or more (and a module that
    imports itself), each sorted, the list sorted: Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    """Print the circles of the packages in `argv` (default PACKAGES); 1 when any."""
    packages = (argv if argv is not None else sys.argv[1:]) or list(PACKAGES)
    graph = grimp.build_graph(*packages, include_external_packages=False, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    found = circles(edges)
    known = [c for c in found if frozenset(c) in KNOWN]
    checked = [k for k in KNOWN if all(m.split(".")[0] in packages for m in k)]
    gone = [k for k in checked if sorted(k) not in found]
    for component in known:
        print(f"cycles: known import circle (to remove): {', '.join(component)}", file=sys.stderr)
    for k in gone:
        print(f"cycles: the known circle {', '.join(sorted(k))} is gone: strike it from KNOWN", file=sys.stderr)
    found = [c for c in found if frozenset(c) not in KNOWN]
    for component in found:
        print(f"cycles: import circle among {', '.join(component)}:", file=sys.stderr)
        members = set(component)
        for importer in component:
            for imported in sorted(edges[importer] & members):
                details = graph.get_import_details(importer=importer, imported=imported)
                where = ", ".join(f"line {d['line_number']}" for d in details)
                print(f"  {importer} imports {imported} ({where})", file=sys.stderr)
    print(f"import circles: {len(found)} new, {len(known)} known, among {len(edges)} modules")
    return 1 if found or gone else 0


if __name__ == "__main__":
    sys.exit(main())
