"""What accelerators this process can use, asked once."""
import functools
import warnings
from typing import Tuple


@functools.lru_cache(maxsize=None)
def cuda_status() -> Tuple[int, str]:
    """(usable GPU count, why CUDA is unusable or ""). torch's own warning about a
    broken driver becomes our one-line note instead of a wall of text."""
    import torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        return count, ""
    reason = next((str(w.message).split(". ")[0] for w in caught), "")
    return 0, f"CUDA not usable ({reason}); running on CPU" if reason else ""
