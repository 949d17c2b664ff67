"""The user-facing contracts in docs/ cannot fall behind the code: every option train_cifar.py
accepts is in docs/CLI.md, every option of the tools is on its page, every HARNESS_*
variable the code reads is explained, and every key a real run
writes into its metrics JSON is in docs/METRICS.md (config keys may instead be documented as
their option in CLI.md)."""
import re
import subprocess
from pathlib import Path

import pytest

from handler.modes import all_modes
from handler.train.config import build_parser
from tests.conftest import ROOT, read_metrics

CLI = (ROOT / "docs" / "CLI.md").read_text()
METRICS = (ROOT / "docs" / "METRICS.md").read_text()


def mentions(page: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", page) is not None


def test_every_option_of_the_parser_is_in_the_cli_page():
    flags = [flag for action in build_parser(all_modes())._actions for flag in action.option_strings
             if flag not in ("-h", "--help")]
    assert len(flags) > 30, flags  # the parser was read, not an empty list
    missing = [flag for flag in flags if not mentions(CLI, flag)]
    assert not missing, f"docs/CLI.md does not mention {missing}; add them to its table"


def help_flags(show_help, capsys) -> list:
    """The --flags a tool's own --help lists in its options (its parser, not a list kept here)."""
    with pytest.raises(SystemExit):
        show_help()
    flags = set(re.findall(r"^  (--[a-z][\w-]*)", capsys.readouterr().out, re.M)) - {"--help"}  # the options list
    assert len(flags) >= 5, flags
    return sorted(flags)


def compare_help():
    from handler.compare.__main__ import parse_args
    parse_args(["--help"])


def bench_comm_help():
    from bench.comm import main
    main(["--help"])


def gpu_check_help():
    from scripts.gpu_check import arguments
    arguments(["--help"])


@pytest.mark.parametrize("show_help, page", [(compare_help, "RESULTS.md"), (bench_comm_help, "COMM.md"),
                                             (gpu_check_help, "GPU_CHECK.md")])
def test_every_option_of_a_tool_is_on_its_page(show_help, page, capsys):
    text = (ROOT / "docs" / page).read_text()
    missing = [flag for flag in help_flags(show_help, capsys) if not mentions(text, flag)]
    assert not missing, f"docs/{page} does not mention {missing}"


def test_every_harness_environment_variable_the_code_reads_is_in_the_docs():
    code = [path for folder in ("handler", "bench", "scripts") for path in (ROOT / folder).rglob("*")
            if path.suffix in (".py", ".sh", ".sbatch")]
    names = {name for path in [*code, ROOT / "train_cifar.py"] for name in re.findall(r"HARNESS_[A-Z_]+", path.read_text())}
    assert len(names) >= 5, names
    docs = "".join(page.read_text() for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    missing = sorted(name for name in names if not mentions(docs, name))
    assert not missing, f"no page in docs/ explains {missing}"


def keys(value, prefix="") -> list:
    """Every key of a metrics file as a dotted path (list items as `[]`), leaves and inner keys."""
    if isinstance(value, dict):
        out = []
        for key, inner in value.items():
            out += [f"{prefix}{key}", *keys(inner, f"{prefix}{key}.")]
        return out
    if isinstance(value, list):
        return [path for item in value for path in keys(item, f"{prefix.rstrip('.')}[].")]
    return []


def documented(path: str) -> bool:
    """env.hosts' keys are rank numbers, which the page writes as `"<rank>"`."""
    *parents, name = path.split(".")
    if parents == ["env", "hosts"]:
        return mentions(METRICS, '"<rank>"')
    if parents[:1] == ["config"]:  # an option: its flag on the CLI page, or the field here
        return mentions(METRICS, name) or mentions(CLI, "--" + name.replace("_", "-")) or mentions(CLI, "--" + name)
    return mentions(METRICS, name)


def test_every_key_a_real_run_writes_into_its_metrics_is_in_the_metrics_page(two_epoch_run):
    _, folder = two_epoch_run("ddp")
    written = sorted(set(keys(read_metrics(folder / "metrics.json"))))
    assert {"config.comm_hook", "env.notes", "epochs[].phase_s.forward", "test.acc"} <= set(written), written
    missing = [path for path in written if not documented(path)]
    assert not missing, f"docs/METRICS.md does not mention {missing}; describe them there"


def test_no_file_points_at_a_design_note_and_no_user_facing_text_cites_an_issue_number():
    """Contracts live in docs/: a reader can follow every reference (tests may name the issue a
    regression test comes from; they are not user-facing)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    here = Path(__file__).relative_to(ROOT).as_posix()
    texts = [name for name in tracked if name != here and name.endswith((".py", ".sh", ".md", ".sbatch", ".txt"))]
    design = [name for name in texts if re.search(r"DESIGN(\.md|:| §)", (ROOT / name).read_text())]
    assert not design, f"these cite a DESIGN note that is not in the repository: {design}"
    user_facing = [name for name in texts if not name.startswith("tests/")]
    issues = [name for name in user_facing if re.search(r"(?i)\bissues? #?\d+", (ROOT / name).read_text())]
    assert not issues, f"these cite an issue number a user cannot follow: {issues}"
