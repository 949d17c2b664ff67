"""Which package runs each --mode: one line per mode below. Each names a module whose MODE
(handler/train/mode.py) brings the mode's own options, their rules, start-up checks and entry,
so the shared code (handler/data, handler/train, handler/runtime) never imports a mode."""
import importlib

PACKAGES = {  # --mode name: the module holding its MODE, in the order --help lists them
    "dp": "handler.DP.mode",
    "ddp": "handler.DDP.mode",
    "ddp_dali": "handler.DALI.mode",
    "fsdp": "handler.FSDP.mode",
    "pp": "handler.PP.mode",
}
MODES = tuple(PACKAGES)


def mode_for(name: str):
    return importlib.import_module(PACKAGES[name]).MODE


def all_modes() -> dict:
    return {name: mode_for(name) for name in MODES}


def parse_config(argv=None, *, cuda_count=None):
    """The command line as a validated Config (handler/train/config.py), every mode's rules included."""
    from .train.config import parse_config as parse
    return parse(argv, all_modes(), cuda_count=cuda_count)


def option_defaults() -> dict:
    """Every option's default under its metrics `config` key, every mode's included: what a
    run recorded before that option existed ran with (readers of old metrics use it)."""
    from .train.config import Config, mode_sections
    return Config(sections=tuple(s() for s in mode_sections(all_modes()))).as_dict()


def option_choices(name: str) -> tuple[str, ...]:
    """The values an option accepts, from the section that declares it (e.g. comm_hook)."""
    from .train.config import SHARED_SECTIONS, mode_sections
    from .train.options import choices_of
    return choices_of((*SHARED_SECTIONS, *mode_sections(all_modes())), name)


def option_owners(name: str) -> tuple:
    """The modes whose own sections declare the option `name` (comm_hook: ddp, ddp_dali)."""
    import dataclasses
    return tuple(mode for mode, m in all_modes().items()
                 if any(f.name == name for s in m.options for f in dataclasses.fields(s)))


def validate(cfg) -> None:
    from .train.config import validate as check
    check(cfg, all_modes())


def preflight(cfg, *, spawning: bool, restarted: bool = False):
    from .train.preflight import preflight as check
    return check(cfg, mode_for(cfg.mode), spawning=spawning, restarted=restarted)


def run_mode(cfg) -> None:
    mode_for(cfg.mode).run(cfg)
