"""A summary made whole for the record (handler/profiling/record/summary.py): a test that writes only the
fields it is about gets the required ones filled in, the rest as it wrote them."""
import copy

LOOP = {"epochs_s": 1.0, "epochs": 1, "steps": 10, "step_mean_ms": 100.0, "inside_steps_ms": 90.0,
        "between_steps_ms": 10.0, "phase_ms": {}}


def whole(summary: dict) -> dict:
    """summary with `ranks` (one, or each given rank with a loop), `overall.epoch_mean_s` and each GPU's
    required shares and times, where it lacks them."""
    out = copy.deepcopy(summary)
    out["ranks"] = [{"loop": dict(LOOP), **r} for r in out.get("ranks") or [{}]]
    out["overall"] = {"epoch_mean_s": None, **(out.get("overall") or {})}
    out["gpus"] = [{"kernel_busy_share": None, "compute_busy_share": None, "epochs_s": 0.0, "nccl_kernel_s": 0.0, **g}
                   for g in out["gpus"]] if out.get("gpus") else out.get("gpus")
    return out
