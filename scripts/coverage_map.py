"""What CI never runs, from scripts/coverage.sh's data (the CI steps it measured).

Prints the line coverage of each product package, the same figure for the lines outside
GPU-only blocks (the goal in docs/RESULTS.md), and every block of lines never executed,
with the function it sits in. Its first line names the CI steps the data holds.

A GPU-only block is a statement whose first line carries a `# gpu-only: PROOF` comment,
PROOF naming the gpu test or gpu_check row that runs it. The block is that statement whole
(an `if`, a `def`, a `with` ...). `--gpu-table` prints the table docs/GPU_CHECK.md holds,
from the source alone (no coverage data needed); tests/tools/test_coverage_map.py checks
that the docs carry it unchanged.

    python scripts/coverage_map.py              the map (after scripts/coverage.sh)
    python scripts/coverage_map.py --gpu-table  the GPU-only table, as markdown
    python scripts/coverage_map.py --write-gpu-table  update docs/GPU_CHECK.md's copy
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("handler", "bench", "models", "scripts", "train_cifar.py")
MARK = re.compile(r"#\s*gpu-only:\s*(?P<proof>.+?)\s*$")


@dataclass(frozen=True)
class GpuBlock:
    path: str      # relative to the repository
    first: int
    last: int
    what: str      # the enclosing function, or the statement's own name
    proof: str


def product_files() -> list[Path]:
    files: list[Path] = []
    for name in PACKAGES:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def _enclosing(tree: ast.AST, line: int) -> str:
    """The innermost function or class around `line` ("module" when none)."""
    best, best_start = "module", -1
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and node.lineno > best_start:
                best, best_start = node.name, node.lineno
    return best


def _marks(source: str) -> dict[int, str]:
    """Line -> proof of every `gpu-only` comment (comments only: not strings or docstrings)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0]: m["proof"] for tok in tokens
            if tok.type == tokenize.COMMENT and (m := MARK.search(tok.string))}


def gpu_blocks(files: list[Path] | None = None) -> list[GpuBlock]:
    """Every statement marked `# gpu-only: PROOF`, with the lines it spans."""
    blocks: list[GpuBlock] = []
    for path in files or product_files():
        source = path.read_text()
        marks = _marks(source)
        if not marks:
            continue
        tree = ast.parse(source)
        starts = {node.lineno: node for node in ast.walk(tree) if isinstance(node, ast.stmt)}
        rel = path.relative_to(ROOT).as_posix()
        for line, proof in sorted(marks.items()):
            node = starts.get(line)
            if node is None:
                raise SystemExit(f"coverage_map: {rel}:{line}: a gpu-only mark must sit on the first line of a statement")
            name = getattr(node, "name", None) or _enclosing(tree, line)
            blocks.append(GpuBlock(rel, line, node.end_lineno or line, name, proof))
    return blocks


def gpu_table(blocks: list[GpuBlock]) -> str:
    rows = ["| file | lines | code | proved by |", "|---|---|---|---|"]
    rows += [f"| `{b.path}` | {b.first}-{b.last} | `{b.what}` | {b.proof} |" for b in blocks]
    return "\n".join(rows)


def write_gpu_table(table: str, docs: Path) -> None:
    """Replace the copy of the table in docs (the rows under its header) with table."""
    lines = docs.read_text().splitlines()
    header = table.splitlines()[0]
    if header not in lines:
        raise SystemExit(f"coverage_map: {docs} has no table headed {header!r}; paste --gpu-table there once")
    first = lines.index(header)
    last = first
    while last < len(lines) and lines[last].startswith("|"):
        last += 1
    docs.write_text("\n".join(lines[:first] + table.splitlines() + lines[last:]) + "\n")


def _runs(lines: list[int], statements: list[int]) -> list[tuple[int, int]]:
    """Missing lines grouped into blocks: consecutive statements, whatever lies between."""
    order = {line: i for i, line in enumerate(statements)}
    runs: list[tuple[int, int]] = []
    for line in lines:
        if runs and order[line] == order[runs[-1][1]] + 1:
            runs[-1] = (runs[-1][0], line)
        else:
            runs.append((line, line))
    return runs


def steps_measured(folder: Path) -> str:
    """The steps scripts/coverage.sh left in folder (each STEP/step.txt: when, seconds, exit)."""
    found = [path.read_text().strip() for path in sorted(folder.glob("*/step.txt"))]
    return "; ".join(found) or "unknown (no STEP/step.txt beside the data)"


def coverage_map(data_file: Path) -> str:
    import coverage  # only the map needs it; --gpu-table runs without

    # Making a Coverage object turns off the saving of the data of a process that coverage.py
    # started itself (its _prevent_sub_process_measurement): called inside a test that
    # scripts/coverage.sh measures, the test's xdist worker lost every line it had run.
    measuring = getattr(coverage.process_startup, "coverage", None)
    cov = coverage.Coverage(data_file=str(data_file), config_file=str(ROOT / ".coveragerc"))
    if measuring is not None:
        measuring._auto_save = True
    cov.load()
    blocks = gpu_blocks()
    gpu_lines = {(b.path, n) for b in blocks for n in range(b.first, b.last + 1)}
    per_package: dict[str, list[int]] = {}   # statements, run, outside-gpu statements, outside-gpu run
    never: list[str] = []
    for path in product_files():
        rel = path.relative_to(ROOT).as_posix()
        _, statements, _, missing, _ = cov.analysis2(str(path))
        if not statements:
            continue
        missed = set(missing)
        outside = [s for s in statements if (rel, s) not in gpu_lines]
        counts = per_package.setdefault(rel.split("/")[0], [0, 0, 0, 0])
        counts[0] += len(statements)
        counts[1] += len(statements) - len(missed)
        counts[2] += len(outside)
        counts[3] += len([s for s in outside if s not in missed])
        tree = ast.parse(path.read_text())
        for first, last in _runs(sorted(s for s in missed if (rel, s) not in gpu_lines), statements):
            never.append(f"  {rel}:{first}-{last}  ({_enclosing(tree, first)})")
    lines = [f"CI steps measured: {steps_measured(data_file.parent)}",
             "line coverage (all lines | outside GPU-only blocks):"]
    totals = [0, 0, 0, 0]
    for name, c in sorted(per_package.items()):
        totals = [t + x for t, x in zip(totals, c)]
        lines.append(f"  {name:<16} {100 * c[1] / c[0]:5.1f} % of {c[0]:>5} | {100 * c[3] / max(c[2], 1):5.1f} % of {c[2]:>5}")
    lines.append(f"  {'all':<16} {100 * totals[1] / totals[0]:5.1f} % of {totals[0]:>5} | "
                 f"{100 * totals[3] / max(totals[2], 1):5.1f} % of {totals[2]:>5}")
    lines.append(f"GPU-only blocks (docs/GPU_CHECK.md): {len(blocks)}, {len(gpu_lines)} lines")
    lines.append(f"blocks never executed outside them: {len(never)}")
    return "\n".join(lines + never)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or " ").splitlines()[0], allow_abbrev=False)
    parser.add_argument("--gpu-table", action="store_true", help="print the GPU-only table for docs/GPU_CHECK.md")
    parser.add_argument("--write-gpu-table", action="store_true", help="update docs/GPU_CHECK.md's copy of it in place")
    parser.add_argument("--data", type=Path, default=ROOT / ".coverage-data" / "cov", help="combined coverage data")
    args = parser.parse_args(argv)
    if args.gpu_table:
        print(gpu_table(gpu_blocks()))
        return 0
    if args.write_gpu_table:
        write_gpu_table(gpu_table(gpu_blocks()), ROOT / "docs" / "GPU_CHECK.md")
        return 0
    if not args.data.exists():
        print(f"coverage_map: no coverage data at {args.data}; run bash scripts/coverage.sh first", file=sys.stderr)
        return 2
    print(coverage_map(args.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
