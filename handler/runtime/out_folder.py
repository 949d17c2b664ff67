"""An output folder, checked before any work: one line when it cannot be made or written in.

The report, its lab page and handler.compare check theirs first, so a bad --out stops them
before an export or a run, with nothing written anywhere (scripts/gpu_check_machine.py says the
same for gpu_check's --out)."""
import errno
import tempfile
from pathlib import Path

from .errors import UserError


def check_out_folder(out: Path, named: str, fix: str | None = None) -> None:
    """named: how the user gave it ("--out"); fix: what to do instead (default: name another
    folder). Creates nothing."""
    folder = out
    try:
        while not folder.is_dir() and not folder.exists() and not folder.is_symlink() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            what = "a link to nothing" if folder.is_symlink() and not folder.exists() else "a file"
            where = f"is {what}" if folder == out else f"is under {folder}, which is {what}"
            raise UserError(f"{named} {out} {where}; {fix or 'name a folder (it is made if missing)'}")
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:  # ENOENT in a folder that is there: a system one (/proc) that takes no new files
        why = "it takes no new files" if err.errno == errno.ENOENT and folder.is_dir() else err.strerror
        raise UserError(f"{named} {out}: cannot write in {folder} ({why}); {fix or 'name a folder you can write'}") from None
