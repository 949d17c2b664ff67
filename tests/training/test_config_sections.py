"""Options are declared once, in sections, and each mode owns its own (handler/train/options.py);
old commands and old metrics files still work (docs/CLI.md, docs/METRICS.md)."""
import argparse
import dataclasses
import json
from dataclasses import dataclass

import pytest

from handler.compare.cells import Cell, Variant
from handler.compare.results import build_rows, dataset_description, recipe
from handler.DALI.options import DaliOptions
from handler.DDP.options import CommOptions
from handler.modes import all_modes, option_defaults, parse_config
from handler.profiling.analysis import comm_config
from handler.profiling.render import hook_and_buckets
from handler.profiling.report import load_metrics
from handler.compare.runner import Outcome
from handler.runtime.errors import UserError
from handler.train import config as config_module
from handler.train.config import SHARED_SECTIONS, build_parser, mode_sections
from handler.train.mode import Mode
from handler.train.options import Options, option
from tests.conftest import ROOT

# The parser of main at 639d54f, before the sections: (flags, dest, default, choices, nargs,
# const, type). Every spelling a user or a script may have typed must keep meaning the same.
OLD_PARSER = [
    (('--mode',), 'mode', 'ddp', ('dp', 'ddp', 'ddp_dali', 'fsdp', 'pp'), None, None, None),
    (('--num_gpu', '--num-gpu'), 'num_gpu', None, None, None, None, 'int'),
    (('--data',), 'data', './data', None, None, None, None),
    (('--dataset',), 'dataset', 'auto', ('auto', 'cifar10', 'synthetic'), None, None, None),
    (('--synthetic-train',), 'synthetic_train', 10000, None, None, None, 'int'),
    (('--synthetic-test',), 'synthetic_test', 2000, None, None, None, 'int'),
    (('--ckpt',), 'ckpt', './ckpt', None, None, None, None),
    (('--save',), 'save', 'ckpt', ('ckpt', 'none'), None, None, None),
    (('--save_ckpt',), 'save_ckpt', False, None, 0, True, None),
    (('--resume',), 'resume', None, None, '?', '', None),
    (('--overwrite',), 'overwrite', False, None, 0, True, None),
    (('--nan-patience',), 'nan_patience', 20, None, None, None, 'int'),
    (('--epochs',), 'epochs', 30, None, None, None, 'int'),
    (('--stop-after',), 'stop_after', 0, None, None, None, 'int'),
    (('--batch-size',), 'batch_size', 256, None, None, None, 'int'),
    (('--model',), 'model', 'resnet18', None, None, None, None),
    (('--lr',), 'lr', 0.1, None, None, None, 'float'),
    (('--momentum',), 'momentum', 0.9, None, None, None, 'float'),
    (('--weight-decay', '--decay'), 'weight_decay', 0.0005, None, None, None, 'float'),
    (('--seed',), 'seed', 0, None, None, None, 'int'),
    (('--workers',), 'workers', 2, None, None, None, 'int'),
    # 5000 stopped the course kit's command line on a set of 5000 or fewer training images; None
    # means 5000, or a tenth of such a set (issue 39, handler/data/dataset.py hold_out).
    (('--valid-size',), 'valid_size', None, None, None, None, 'int'),
    (('--cutout',), 'cutout', 0, None, None, None, 'int'),
    (('--metrics',), 'metrics', '', None, None, None, None),
    (('--host', '--ip'), 'host', '127.0.0.1', None, None, None, None),
    (('--port',), 'port', 0, None, None, None, 'int'),
    (('--dist-timeout',), 'dist_timeout', 120.0, None, None, None, 'float'),
    (('--amp',), 'amp', 'off', ('off', 'bf16', 'fp16'), None, None, None),
    (('--channels-last',), 'channels_last', False, None, 0, True, None),
    (('--accum-steps',), 'accum_steps', 1, None, None, None, 'int'),
    (('--activation-checkpointing',), 'activation_checkpointing', False, None, 0, True, None),
    (('--sync-bn',), 'sync_bn', False, None, 0, True, None),
    (('--dp-balanced',), 'dp_balanced', False, None, 0, True, None),
    # None meant "resolved inside the DALI loader", so the metrics said "" whichever source ran.
    (('--dali-source',), 'dali_source', 'memory', ('memory', 'raw', 'jpeg', 'files'), None, None, None),
    (('--pp-schedule',), 'pp_schedule', '1f1b', ('gpipe', '1f1b'), None, None, None),
    (('--pp-split',), 'pp_split', 'time', ('params', 'time'), None, None, None),
    (('--microbatches',), 'microbatches', 4, None, None, None, 'int'),
    (('--comm-hook',), 'comm_hook', 'allreduce', ('allreduce', 'fp16', 'bf16', 'powersgd'), None, None, None),
    (('--powersgd-rank',), 'powersgd_rank', 2, None, None, None, 'int'),
    (('--powersgd-warmup',), 'powersgd_warmup', 10, None, None, None, 'int'),
    (('--bucket-cap-mb',), 'bucket_cap_mb', 25.0, None, None, None, 'float'),
    (('--static-graph',), 'static_graph', False, None, 0, True, None),
    (('--grad-as-bucket-view',), 'grad_as_bucket_view', False, None, 0, True, None),
    (('--profile-epochs',), 'profile_epochs', '', None, None, None, None),
    (('--no-progress',), 'progress', True, None, 0, False, None),
]
OLD_METRICS = ROOT / "tests/data/metrics/ddp_powersgd_639d54f.metrics.json"  # written by main at 639d54f


def parser_rows() -> dict:
    parser = build_parser(all_modes())
    return {flag: a for a in parser._actions if not isinstance(a, argparse._HelpAction) for flag in a.option_strings}


@pytest.mark.parametrize("row", OLD_PARSER, ids=lambda r: r[0][0])
def test_every_flag_of_the_old_parser_keeps_its_dest_default_and_choices(row):
    flags, dest, default, choices, nargs, const, type_name = row
    actions = parser_rows()
    for flag in flags:
        a = actions[flag]
        assert (a.dest, a.default, tuple(a.choices) if a.choices else None, a.nargs, a.const,
                getattr(a.type, "__name__", None)) == (dest, default, choices, nargs, const, type_name), flag


def test_the_parser_has_no_flag_the_old_one_lacked_and_lost_none():
    assert set(parser_rows()) == {flag for row in OLD_PARSER for flag in row[0]}


def test_old_spellings_parse_to_the_same_values():
    cfg = parse_config(["--num-gpu", "2", "--mode", "ddp", "--no-progress", "--resume", "--weight-decay", "0.001",
                        "--comm-hook", "powersgd", "--powersgd-rank", "4"], cuda_count=0)
    assert (cfg.num_gpu, cfg.progress, cfg.resume, cfg.weight_decay) == (2, False, "", 0.001)
    assert (CommOptions.of(cfg).comm_hook, CommOptions.of(cfg).powersgd_rank) == ("powersgd", 4)


def test_each_option_is_declared_in_exactly_one_section():
    sections = [*SHARED_SECTIONS, *mode_sections(all_modes())]
    names = [f.name for s in sections for f in dataclasses.fields(s)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_metrics_config_keeps_the_old_flat_keys():
    old = json.loads(OLD_METRICS.read_text())["config"]
    for mode in ("ddp", "ddp_dali", "pp", "dp", "fsdp"):
        assert set(parse_config(["--mode", mode], cuda_count=0).as_dict()) == set(old), mode


def test_ddp_dali_records_the_source_that_runs():
    # It was "" unless --dali-source was given, though the loader then read `memory`.
    assert parse_config(["--mode", "ddp_dali"], cuda_count=0).as_dict()["dali_source"] == "memory"
    cfg = parse_config(["--mode", "ddp_dali", "--dali-source", "jpeg"], cuda_count=0)
    assert cfg.as_dict()["dali_source"] == DaliOptions.of(cfg).dali_source == "jpeg"


def test_an_old_metrics_file_still_loads_in_the_profiler_and_the_comparison():
    metrics = load_metrics(OLD_METRICS)
    comm = comm_config(metrics)
    assert comm == {"hook": "powersgd", "bucket_cap_mb": 25.0, "powersgd_rank": 4, "static_graph": False,
                    "grad_as_bucket_view": False}
    assert hook_and_buckets(comm) == ("powersgd rank 4", "25 MB")
    outcome = Outcome(Cell(Variant("ddp", "ddp"), 1), "ok", metrics=metrics)
    row = build_rows([outcome])[0]
    assert row.epochs_timed == 1 and row.test_acc == 0.3 and row.phase_source == "loop timers"
    assert dataset_description([outcome]).startswith("synthetic (generated, 40 train / 10 test images")
    assert recipe([outcome]) == {"model": "resnet20", "epochs": 1, "batch_size": 8, "workers": 0, "valid_size": 10}


def test_metrics_from_before_the_comm_options_read_as_the_comm_sections_defaults():
    config = {k: v for k, v in json.loads(OLD_METRICS.read_text())["config"].items()
              if k not in {f.name for f in dataclasses.fields(CommOptions)}}
    defaults = CommOptions()
    assert comm_config({"config": config}) == {"hook": defaults.comm_hook, "bucket_cap_mb": defaults.bucket_cap_mb,
                                               "powersgd_rank": None, "static_graph": False,
                                               "grad_as_bucket_view": False}
    assert option_defaults()["bucket_cap_mb"] == defaults.bucket_cap_mb


# ---- a mode that is not one of ours: shared code knows it only through its Mode -------------
@dataclass(frozen=True, kw_only=True)
class ToyOptions(Options):
    TITLE = "toy"
    REFUSAL = "{flags} tune{s} the toy; use --mode {owners}, or drop {it} for --mode {mode}"
    toy_knob: int = option(3, metavar="K", help="the toy's knob")


def toy_modes() -> dict:
    ddp = all_modes()["ddp"]
    return {"ddp": ddp, "toy": Mode(run=ddp.run, options=(ToyOptions,), whole_batch=True)}


def test_a_modes_section_becomes_its_flags_and_other_modes_refuse_them():
    cfg = config_module.parse_config(["--mode", "toy", "--toy-knob", "5", "--num_gpu", "2"], toy_modes(),
                                     cuda_count=0)
    assert ToyOptions.of(cfg).toy_knob == 5 and cfg.as_dict()["toy_knob"] == 5
    with pytest.raises(UserError) as err:
        config_module.parse_config(["--toy-knob", "5"], toy_modes(), cuda_count=0)
    assert str(err.value) == "--toy-knob tunes the toy; use --mode toy, or drop it for --mode ddp"


def test_the_per_process_batch_comes_from_the_mode_not_its_name():
    # Once `local_batch` asked whether the mode was called "pp".
    cfg = config_module.parse_config(["--mode", "toy", "--num_gpu", "2", "--batch-size", "64"], toy_modes(),
                                     cuda_count=0)
    assert cfg.world_size == 2 and cfg.local_batch == 64
    assert parse_config(["--mode", "ddp", "--num_gpu", "2", "--batch-size", "64"], cuda_count=0).local_batch == 32
