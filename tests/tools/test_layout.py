"""The repository's shape stays what the README says: every folder listed, shared code
free of mode imports, no package over 15 modules, every relative link in the docs alive; and
the code reads in plain sight: `fit` an outline, the DDP start path mapped, one `dist`."""
import ast
import inspect
import re
import subprocess
from pathlib import Path

import pytest

from handler.train import trainer
from tests.conftest import ROOT

SHARED = ("handler/runtime", "handler/data", "handler/train", "handler/profiling", "handler/compare")
MODE_IMPORT = re.compile(r"^\s*(from|import)\s+(\.\.|handler\.)(DALI|DDP|FSDP|PP|DP)\b", re.M)
PACKAGE_ROOTS = ("handler", "bench", "models", "tests")
MAX_MODULES = 15
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def section(markdown: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def listed_folders() -> set:
    """The folders the README's layout section names at the start of a line."""
    text = section((ROOT / "README.md").read_text(), "Repository layout")
    return {m.group(1).rstrip("/") for m in re.finditer(r"^(\.?[\w./-]+/)\s", text, re.M)}


def package_folders() -> set:
    return {str(init.parent.relative_to(ROOT)) for base in PACKAGE_ROOTS
            for init in (ROOT / base).rglob("__init__.py")
            if "__pycache__" not in init.parts and ".venv" not in init.parts}


def tracked_top_folders() -> set:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked top-level folders are unknown")
    return {path.split("/")[0] for path in out.splitlines() if "/" in path}


def test_the_layout_section_lists_every_package_and_top_level_folder():
    missing = (package_folders() | tracked_top_folders()) - listed_folders()
    assert not missing, f"add to README.md's 'Repository layout': {sorted(missing)}"


def test_the_layout_section_names_only_folders_that_exist():
    gone = {folder for folder in listed_folders() if not (ROOT / folder).is_dir()}
    assert not gone, f"README.md's 'Repository layout' lists folders that do not exist: {sorted(gone)}"


def test_the_package_finder_sees_the_shared_rooms_and_every_mode():
    # guards the two tests above against a finder that silently finds nothing
    assert {"handler/runtime", "handler/data", "handler/train", "handler/DDP", "handler/PP",
            "bench", "models", "tests", "tests/training"} <= package_folders()


def test_no_shared_module_imports_a_mode_package():
    offenders = [f"{path.relative_to(ROOT)}: {m.group(0).strip()}"
                 for folder in SHARED for path in sorted((ROOT / folder).rglob("*.py"))
                 for m in MODE_IMPORT.finditer(path.read_text())]
    assert not offenders, "shared code imports a mode; let the mode contribute it through its " \
                          f"Mode or Strategy instead: {offenders}"


def test_the_mode_import_pattern_catches_both_spellings():
    assert MODE_IMPORT.search("    from ..DALI.cifar10_loader import require_dali")
    assert MODE_IMPORT.search("import handler.PP.options")
    assert not MODE_IMPORT.search("from ..data.loaders import Loaders")


def test_no_package_holds_more_than_fifteen_modules():
    crowded = {folder: n for folder in package_folders()
               if (n := sum(1 for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")) > MAX_MODULES}
    assert not crowded, f"split these packages (at most {MAX_MODULES} modules each): {crowded}"


def test_every_package_says_what_lives_there():
    bare = sorted(folder for folder in package_folders() if folder.startswith("handler/")
                  and not (ROOT / folder / "__init__.py").read_text().lstrip().startswith('"""'))
    assert not bare, f"give these packages a docstring in __init__.py: {bare}"


def anchors(markdown: str) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, -N for repeats."""
    seen, out, fenced = {}, set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = not fenced and re.match(r"^#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = {str(page.relative_to(ROOT)): links for page in pages if (links := broken_links(page))}
    assert not broken, f"fix these links: {broken}"


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## Pipeline parallelism (`pp`)\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#pipeline-parallelism-pp) [b](gone.md) [c](other.md#nowhere) "
                    "[d](https://example.org/x)\n")
    assert broken_links(page) == ["gone.md (no such file)", "other.md#nowhere (no such heading)"]


def test_the_readme_is_a_front_page_of_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail into docs/"


def test_the_entry_point_docstring_names_every_mode():
    from handler.modes import MODES
    doc = (ROOT / "train_cifar.py").read_text().split('"""')[1]
    assert all(f"({mode})" in doc for mode in MODES), doc


# ---- reading in plain sight: fit is an outline (handler/train/trainer.py, its set-up in
# build.py), the DDP start path is mapped in handler/DDP/__init__.py, `dist` is the harness's.

MAX_FIT_LINES = 40
TORCH_AS_DIST = re.compile(r"^\s*import torch\.distributed as dist\b|^\s*from torch import distributed as dist\b", re.M)
MAP_ENTRY = re.compile(r"^\s+(?:\.\./)?([\w/]+\.py)\s+(\w+)", re.M)  # "  DDP/run.py   worker(...)"


def test_fit_stays_an_outline_of_at_most_forty_lines():
    lines = inspect.getsource(trainer.fit).splitlines()
    assert len(lines) <= MAX_FIT_LINES, (
        f"fit is {len(lines)} lines; move set-up into build_run (handler/train/build.py) or a "
        f"named step beside fit, so it stays at most {MAX_FIT_LINES}")


def test_fit_builds_its_run_in_one_call():
    # The set-up is one named step, not a preamble that grows back inside fit.
    source = inspect.getsource(trainer.fit)
    assert source.count("build_run(") == 1
    assert "build_model" not in source and "make_loaders" not in source


def test_dist_always_names_the_harness_module_never_torch_distributed():
    offenders = sorted(rel for folder in ("handler", "bench", "scripts", "tests")
                       for path in (ROOT / folder).rglob("*.py")
                       if ".venv" not in path.parts and TORCH_AS_DIST.search(path.read_text())
                       and (rel := str(path.relative_to(ROOT))))
    assert not offenders, f"import torch.distributed as tdist in: {offenders}"


def test_the_ddp_call_map_names_functions_where_they_are_defined():
    doc = (ROOT / "handler/DDP/__init__.py").read_text()
    entries = MAP_ENTRY.findall(doc)
    assert len(entries) >= 8, entries  # the spawned path, entry to teardown
    missing = []
    for path, name in entries:
        file = ROOT / path if path == "train_cifar.py" else ROOT / "handler" / path
        tree = ast.parse(file.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if name not in defined:
            missing.append(f"{path}: {name}")
    assert not missing, f"handler/DDP/__init__.py's call map names what is not there: {missing}"


BENCH_IMPORT = re.compile(r"^\s*(from|import)\s+bench\b", re.M)


def test_nothing_under_handler_imports_bench():
    # bench/ measures handler/; handler/ (the what-if's model too) never reaches up into it.
    offenders = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "handler").rglob("*.py")
                       if BENCH_IMPORT.search(path.read_text()))
    assert not offenders, f"these import bench/; move what they need into handler/: {offenders}"
    assert BENCH_IMPORT.search("from bench.comm_model import exchange_s") and not BENCH_IMPORT.search("import benchmark")
