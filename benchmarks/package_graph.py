"""Benchmark: the shape of the code, as figures: lines per package, long functions, the package
import graph and its arrows that run back up, and string-keyed reads of round rows.

    python -m benchmarks.package_graph [--repo DIR]

Reads the product packages of a checkout (this one, or DIR: an older commit's worktree, to
compare) with ast alone, nothing imported, so any commit can be measured:
- lines per package (all lines of its .py files; generated protobuf modules left out);
- functions (and methods) longer than 60, 80 and 100 lines;
- the package graph: one node per folder that is a Python package (coordinator,
  coordinator/rules, ...), an arrow A -> B where a module of A imports one of B. An arrow runs
  back up where it closes a loop: A and B reach each other, so no order of the folders puts
  every arrow downwards. Counted: the arrows inside such loops (strongly connected parts);
  the loops are printed;
- string-keyed row reads, `row["..."]` and `row.get("...")`, outside the round record's own
  module (the check of issue 32), and the wider count of any `<name with row or record>["..."]`.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import defaultdict
from pathlib import Path

PRODUCT = ("proto", "coordinator", "edge_agent", "trace_recorder", "loadgen", "simulator", "workloads", "flexfl")
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")
TEMPLATE = ("flexfl/starter/", "flexfl/app/starter/")  # `flexfl new`'s template: package data, not FlexFL
RECORD_MODULES = ("coordinator/round_record.py", "coordinator/rules/round_record.py")
ROW_READ = re.compile(r"""\brow(?:\[|\.get\()["']""")
ANY_ROW_READ = re.compile(r"""\b\w*(?:row|rec)\w*(?:\[|\.get\()["']""")


def product_files(repo: Path) -> list[Path]:
    out = []
    for package in PRODUCT:
        for path in sorted((repo / package).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            if GENERATED.search(rel) or rel.startswith(TEMPLATE):
                continue
            out.append(path)
    return out


def folder_of(repo: Path, path: Path) -> str:
    """The package (folder with an __init__.py) a module lives in, dotted; proto/ is installed as flexfl.proto."""
    folder = path.parent
    while folder != repo and not (folder / "__init__.py").exists():
        folder = folder.parent
    return folder.relative_to(repo).as_posix().replace("/", ".")


def imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]  # `from pkg import module`
    return names


def package_graph(repo: Path, files: list[Path]) -> dict[str, set[str]]:
    packages = {folder_of(repo, f) for f in files}
    edges: dict[str, set[str]] = defaultdict(set)
    for path in files:
        here = folder_of(repo, path)
        for name in imported_modules(ast.parse(path.read_text())):
            name = name.replace("flexfl.proto", "proto", 1) if name.startswith("flexfl.proto") else name
            # The deepest package the imported name lies in.
            parts = name.split(".")
            target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in packages),
                          None)
            if target is not None and target != here:
                edges[here].add(target)
    for package in packages:
        edges.setdefault(package, set())
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected parts of the graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            parts.append(part)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return parts


def long_functions(repo: Path, files: list[Path]) -> list[tuple[int, str]]:
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    out.append((length, f"{path.relative_to(repo).as_posix()}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.package_graph", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout to measure (default: this one)")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    files = product_files(repo)
    if not files:
        parser.error(f"{repo}: no product package ({', '.join(PRODUCT)}) found")
    print(f"checkout: {repo}")
    lines: dict[str, int] = defaultdict(int)
    for path in files:
        lines[path.relative_to(repo).parts[0]] += len(path.read_text().splitlines())
    print("lines per package: " + ", ".join(f"{p} {lines[p]:,}" for p in PRODUCT if p in lines)
          + f"; all {sum(lines.values()):,} in {len(files)} modules")
    longs = long_functions(repo, files)
    print(f"functions over 60 / 80 / 100 lines: {len(longs)} / {sum(n > 80 for n, _ in longs)} / "
          f"{sum(n > 100 for n, _ in longs)}")
    for length, where in longs:
        print(f"  {length:4d}  {where}")
    edges = package_graph(repo, files)
    loops = [part for part in strongly_connected(edges) if len(part) > 1]
    back = sum(1 for part in loops for a in part for b in edges[a] if b in part)
    print(f"package graph: {len(edges)} packages, {sum(map(len, edges.values()))} arrows, "
          f"{back} in loops (arrows that run back up)")
    for part in loops:
        print("  loop: " + ", ".join(sorted(part)))
        for a in sorted(part):
            print(f"    {a} -> " + ", ".join(sorted(b for b in edges[a] if b in part)))
    reads = wide = 0
    where: dict[str, int] = defaultdict(int)
    for path in files:
        rel = path.relative_to(repo).as_posix()
        if rel in RECORD_MODULES:
            continue
        text = path.read_text()
        reads += len(ROW_READ.findall(text))
        found = len(ANY_ROW_READ.findall(text))
        wide += found
        if found:
            where[rel] = found
    print(f'string-keyed row reads outside the round record: row["..."] / row.get("..."): {reads}; '
          f'any *row*/*rec*["..."]: {wide} in {len(where)} modules')
    for rel, count in sorted(where.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
