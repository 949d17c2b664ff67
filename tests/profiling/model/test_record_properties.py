"""Properties over summaries and metrics generated from the records' own schema (schema_strategies.py:
every optional field present and absent, every number at its edges): the what-if, the lab page and
compare give a finite answer or one line (UserError), never a traceback; a summary the records accept
is the same summary once written and read again (the report writes through them)."""
import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from handler.compare.cells import Cell, Variant
from handler.compare.predict import add_predictions, markdown as compare_lines
from handler.compare.report import results_table
from handler.compare.results import build_rows
from handler.compare.runner import Outcome
from handler.profiling import whatif
from handler.profiling.lab.page import summary_row, verdict
from handler.profiling.lab.whatif_folder import lab_section
from handler.profiling.record.parse import parse_summary
from handler.runtime.errors import UserError
from tests.profiling.model.schema_strategies import metrics, record, summaries
from tests.profiling.model.test_whatif_properties import runs

SOME = settings(derandomize=True, database=None, deadline=None, max_examples=80)
FEW = settings(derandomize=True, database=None, deadline=None, max_examples=30)
MODES = ("dp", "ddp", "ddp_dali", "fsdp", "pp", "ddp+amp [fp16]")


def one_line(err: UserError) -> bool:
    return bool(str(err).strip()) and "\n" not in str(err)


def finite_cells(found: whatif.Prediction) -> bool:
    cells = [*found["cells"], *(found["through_host"] or []), *(found["fast_nodes"] or [])]
    return all(math.isfinite(c[k]) and c[k] >= 0 for c in cells for k in ("epoch_s", "keeps_up_epoch_s", "step_ms"))


# Found by this test: a bucket cap of 1e-323 MB made DDP's bucket count infinite (an OverflowError).
TINY_CAP = {"ranks": [{"loop": {"epochs_s": 0.0, "phase_ms": {}, "between_steps_ms": -1e-09, "step_mean_ms": None,
                                "inside_steps_ms": 0.0, "epochs": 0, "steps": 10**12}},
                      {"loop": {"epochs_s": 1.0, "epochs": 1, "steps": 1, "step_mean_ms": 0.0, "inside_steps_ms": None,
                                "between_steps_ms": None, "phase_ms": {}}}],
            "overall": {"epoch_mean_s": None}, "comm_config": {"bucket_cap_mb": 1e-323}}


@SOME
@given(summaries(), st.sampled_from(((1,), (1, 2, 4, 8), (3, 16))))
@example(TINY_CAP, (1,))
def test_the_whatif_on_any_summary_the_records_take_is_finite_or_one_line(summary, counts):
    try:
        found = whatif.predictions(summary, counts)
        text = "\n".join(whatif.markdown(found, "generated"))
    except UserError as err:
        assert one_line(err), err
        return
    assert finite_cells(found), found["cells"]
    assert " nan" not in text and " inf " not in text


@SOME
@given(runs(), record("Machine"), st.one_of(st.none(), record("Run")), st.one_of(st.none(), record("CommConfig")))
def test_a_coherent_run_with_any_machine_run_and_comm_block_is_finite_or_one_line(summary, machine, run, comm):
    """The generated runs of test_whatif_properties.py (every mode, count, node and convention), their
    optional blocks drawn from the records: present, absent, each field at its edges."""
    bent = {**summary, "machine": machine, "comm_config": comm}
    if run is not None:
        bent["run"] = run
    try:
        found = whatif.predictions(bent, (1, 2, 4, 8))
        "\n".join(whatif.markdown(found, "generated"))
        verdict(bent)
    except UserError as err:
        assert one_line(err), err
        return
    assert finite_cells(found), found["cells"]


@FEW
@given(st.lists(st.tuples(summaries(), st.sampled_from(MODES), st.sampled_from((None, 1, 2, 4))), min_size=1, max_size=3))
def test_the_lab_pages_rows_and_what_if_section_on_any_summaries_are_lines_never_a_traceback(cells):
    rows = [summary_row(s, {"report": f"r{i}.sqlite", "mode": mode, "gpus": gpus})
            for i, (s, mode, gpus) in enumerate(cells)]
    lines = lab_section(rows)
    assert all(isinstance(line, str) and "Traceback" not in line for line in lines)
    assert all(r["verdict"]["line"] for r in rows)


@FEW
@given(st.lists(st.tuples(summaries(), metrics(), st.sampled_from((1, 2, 4))), min_size=1, max_size=3))
def test_compare_on_any_cells_profiles_and_metrics_gives_rows_and_predictions_never_a_traceback(cells):
    outcomes = [Outcome(Cell(Variant("ddp", "ddp"), count), "ok", 0, metrics=m, profile=s, folder=f"cells/ddp-n{count}")
                for s, m, count in cells]
    rows = build_rows(outcomes)
    add_predictions(rows, outcomes)
    "\n".join([*results_table(rows), *compare_lines(rows)])
    for r in rows:
        for value in (r.epoch_s, r.predicted_epoch_s, r.prediction_error, r.speedup):
            assert value is None or math.isfinite(value), r


@SOME
@given(summaries())
def test_a_summary_the_records_take_reads_the_same_once_written(summary):
    parsed = parse_summary(summary, "generated")
    again = parse_summary(json.loads(json.dumps(parsed.model_dump(mode="json", by_alias=True))), "written")
    assert again == parsed
