"""python -m handler.profiling.record --schema > docs/summary.schema.json: the summary's contract, made
from the models (a test fails when the committed file differs)."""
import json
import sys

from handler.runtime.errors import OneLineParser, one_line_errors

from .parse import schema


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="python -m handler.profiling.record", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--schema", action="store_true", required=True, help="print docs/summary.schema.json")
    parser.parse_args(argv)
    print(json.dumps(schema(), indent=2))


if __name__ == "__main__":
    with one_line_errors("record"):
        main(sys.argv[1:])
