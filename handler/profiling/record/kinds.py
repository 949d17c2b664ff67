"""The kinds of value a summary or a metrics JSON holds, each with its range and the title an error
names it by (record/parse.py). Every number is finite (Python's json reads NaN and infinity) and
typed strictly: no string stands for a number, no true for a count."""
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class Record(BaseModel):
    """Fields not declared are kept as they are (other parts of the report write them); readers use
    the declared ones only. A new field is one line in its model."""
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow", use_attribute_docstrings=True,
                              frozen=True)


def _whole(value: object) -> object:
    """A whole number written as a float (5.0, as JSON Schema's `integer` takes it) is that number."""
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else value


WHOLE = BeforeValidator(_whole)  # after the range, so that the schema keeps it
Time = Annotated[float, Field(ge=-1e-9, le=1e7, title="a time >= 0 (seconds, at most 1e7)")]
TimeOrNull = Annotated[Annotated[float, Field(ge=-1e-9, le=1e7)] | None,
                       Field(title="a time >= 0 or null (seconds, at most 1e7)")]
MsOrNull = Annotated[Annotated[float, Field(ge=-1e-9, le=1e10)] | None,
                     Field(title="a time >= 0 or null (ms, at most 1e10)")]
Count = Annotated[int, Field(ge=0, le=10**12, title="a whole number >= 0"), WHOLE]
CountOrNull = Annotated[Annotated[int, Field(ge=0, le=10**12), WHOLE] | None, Field(title="a whole number >= 0 or null")]
Positive = Annotated[int, Field(ge=1, le=10**6, title="a whole number from 1 to 1e6"), WHOLE]
PositiveOrNull = Annotated[Annotated[int, Field(ge=1, le=10**6), WHOLE] | None,
                           Field(title="a whole number from 1 to 1e6, or null")]
Devices = Annotated[int, Field(ge=0, le=10**6, title="a whole number from 0 to 1e6"), WHOLE]
Share = Annotated[float, Field(ge=0, le=1e6, title="a share >= 0")]
ShareOrNull = Annotated[Annotated[float, Field(ge=0, le=1e6)] | None, Field(title="a share >= 0 or null")]
BusyShareOrNull = Annotated[Annotated[float, Field(ge=0, le=1)] | None, Field(title="a share from 0 to 1, or null")]
BubbleOrNull = Annotated[Annotated[float, Field(ge=0, lt=1)] | None,
                         Field(title="a share from 0 to below 1, or null")]
SizeOrNull = Annotated[Annotated[float, Field(gt=0, le=1e7)] | None,
                       Field(title="a size in MB > 0 (up to 1e7), or null")]
Workers = Annotated[Annotated[float, Field(ge=0, le=4096)] | None,
                    Field(title="a number of workers from 0 to 4096, or null")]
EpochOrNull = Annotated[Annotated[float, Field(gt=0, le=1e7)] | None, Field(title="a time in seconds > 0, or null")]
Number = Annotated[float, Field(ge=0, title="a number >= 0")]
NumberOrNull = Annotated[Annotated[float, Field(ge=0)] | None, Field(title="a number >= 0, or null")]
AnyNumberOrNull = Annotated[float | None, Field(title="a number or null")]
Text = Annotated[str, Field(title="a text")]
TextOrNull = Annotated[str | None, Field(title="a text or null")]
Mode = Literal["dp", "ddp", "ddp_dali", "fsdp", "pp"]
ModeOrNull = Annotated[Mode | None, Field(title="one of dp, ddp, ddp_dali, fsdp, pp or null")]
