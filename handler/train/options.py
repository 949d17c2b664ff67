"""Options declared once: each is a dataclass field of one section, with its default, flags
and help beside it, and the command line is generated from the sections (docs/CLI.md).

The shared sections live in handler/train/config.py; a mode package that has options of its
own declares its section in its options.py and names it in its Mode (handler/train/mode.py).
"""
import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Optional, Sequence, Type, TypeVar

S = TypeVar("S", bound="Options")


@dataclass(frozen=True)
class Range:
    """The values a numeric option takes: finite, from `low` to `high` (None: unbounded),
    either end left out when open. `fix` replaces the generic advice where the reason is
    worth saying."""
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    fix: str = ""

    def holds(self, value: float) -> bool:
        return (math.isfinite(value)
                and (self.low is None or value > self.low or (value == self.low and not self.low_open))
                and (self.high is None or value < self.high or (value == self.high and not self.high_open)))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'above' if self.low_open else 'at least'} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


def at_least(low: float, fix: str = "") -> Range:
    return Range(low, fix=fix)


def above(low: float, fix: str = "") -> Range:
    return Range(low, low_open=True, fix=fix)


def option(default: Any, *flags: str, help: str = "", cli_default: Any = ..., within: Optional[Range] = None,
           **argparse_kwargs: Any) -> Any:
    """A field with its command line: `flags` (default `--the-name`), `help`, and any other
    argparse keyword. `cli_default` is what the parser gives when the flag is absent, where
    that differs from the field's default (None: resolved later by parse_config). `within`:
    a numeric option's range, checked with every other before any process starts (out_of_range)."""
    meta = {"flags": flags, "help": help, "argparse": argparse_kwargs}
    if cli_default is not ...:
        meta["cli_default"] = cli_default
    if within is not None:
        meta["within"] = within
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class Options:
    """A section: frozen, keyword-only, one `option` per field. A mode's section says, in
    REFUSAL, why its options mean nothing to the other modes; `{flags}`, `{s}` (verb ending),
    `{it}`, `{owners}` and `{mode}` are filled in."""
    TITLE: ClassVar[str] = ""
    REFUSAL: ClassVar[str] = ""

    @classmethod
    def of(cls: Type[S], cfg: Any) -> S:
        """This section of a Config (its defaults where the Config was built without it)."""
        return cfg.section(cls)


def flags_of(f: dataclasses.Field) -> tuple:
    return f.metadata.get("flags") or ("--" + f.name.replace("_", "-"),)


def add_section(parser: argparse.ArgumentParser, section: type, overrides: dict) -> None:
    """One argument group per section; `overrides` (by field name) adds argparse keywords
    known only at parse time, such as --mode's choices."""
    group = parser.add_argument_group(section.TITLE)
    for f in dataclasses.fields(section):
        if "flags" not in f.metadata:
            continue
        kwargs = {"dest": f.name, "help": f.metadata["help"] or None, **f.metadata["argparse"],
                  **overrides.get(f.name, {})}
        kwargs.setdefault("default", f.metadata.get("cli_default", f.default))
        if isinstance(f.default, bool):
            kwargs.setdefault("action", "store_true")
        elif isinstance(f.default, (int, float)) and "type" not in kwargs:
            kwargs["type"] = type(f.default)
        group.add_argument(*flags_of(f), **kwargs)


def out_of_range(options: Any) -> Optional[str]:
    """The first numeric option of `options` (a section, or a Config) outside its range, as
    the line that names it and its range; None when all hold."""
    for f in dataclasses.fields(options):
        within, value = f.metadata.get("within"), getattr(options, f.name)
        if within is not None and value is not None and not within.holds(value):
            shown = f"{value:g}" if isinstance(value, float) else value
            kind = "a finite number" if isinstance(value, float) else "a whole number"
            return f"{flags_of(f)[0]} {shown}: {within.fix or f'use {kind} {within}'}"
    return None


def section_values(section: type, values: dict) -> dict:
    """The entries of `values` (parsed, by field name) that belong to `section`."""
    names = {f.name for f in dataclasses.fields(section)}
    return {k: v for k, v in values.items() if k in names}


def changed(options: Options) -> list:
    """The flags of `options` whose values differ from their defaults, in declaration order."""
    return [flags_of(f)[0] for f in dataclasses.fields(options)
            if "flags" in f.metadata and getattr(options, f.name) != f.default]


def flat(sections: Iterable[Options]) -> dict:
    """Every section's fields under their own names: the metrics' `config` keys (docs/METRICS.md)."""
    out = {}
    for options in sections:
        out.update(dataclasses.asdict(options))
    return out


def unique(sections: Iterable[type]) -> list:
    """Each section once, in first-seen order (ddp and ddp_dali share the comm section)."""
    return list(dict.fromkeys(sections))


def refusal(section: type, flags: Sequence[str], owners: Sequence[str], mode: str) -> str:
    one = len(flags) == 1
    return section.REFUSAL.format(flags=" ".join(flags), s="s" if one else "", it="it" if one else "them",
                                  owners=" or ".join(owners), mode=mode)


def choices_of(sections: Iterable[type], name: str) -> tuple:
    for section in sections:
        for f in dataclasses.fields(section):
            if f.name == name:
                return tuple(f.metadata["argparse"].get("choices", ()))
    raise KeyError(name)
