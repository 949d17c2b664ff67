"""The nsys command line: finding it and exporting a report to SQLite."""
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
from contextlib import closing, contextmanager
from pathlib import Path

from handler.runtime.errors import UserError, too_long

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # .qdrep: nsys before 2021.4


def reports_in(folder: Path) -> list[Path]:
    """A folder's reports: its .nsys-rep (.qdrep) files, and each .sqlite that is not the export
    of one of them (a teammate's export copied in beside them is a report of its own)."""
    reports = [p for p in folder.iterdir() if p.suffix in REPORT_SUFFIXES]
    stems = {p.stem for p in reports}
    return sorted([*reports, *(p for p in folder.glob("*.sqlite") if p.stem not in stems)])


UNFINISHED = ("nsys's unfinished capture (.qdstrm): nsys stopped before writing the .nsys-rep (it, or the run, "
              "was killed, or the disk filled); record the run again")


def no_reports(folder: Path, fix: str) -> str:
    """The one line for a folder without reports, saying what it holds instead."""
    try:
        held = sorted(p.name for p in folder.iterdir())
    except OSError as err:
        return f"{folder} cannot be read ({err.strerror}); check its permissions"
    if any(name.endswith(".qdstrm") for name in held):
        return f"{folder} holds no .nsys-rep or .sqlite report, only {UNFINISHED}"
    what = f"it holds {', '.join(held[:3])}{', ...' if len(held) > 3 else ''}" if held else "it is empty"
    return f"{folder} holds no .nsys-rep or .sqlite report ({what}); {fix}"


INSTALL_HINT = "install it with scripts/install_nsys.sh (or from https://developer.nvidia.com/nsight-systems)"


def nsys_executable() -> str:
    path = shutil.which("nsys")
    if path is None:
        raise UserError(f"nsys is not on PATH; {INSTALL_HINT}, or pass an exported .sqlite instead")
    return path


def nsys_version() -> str | None:
    """'2022.4.2.1-df9881f' from 'NVIDIA Nsight Systems version 2022.4.2.1-df9881f'."""
    path = shutil.which("nsys")
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return out.rsplit(" ", 1)[-1] or None


# A report names the nsys that wrote it near its start: "...Report 2025@5@1@..." (2024 on, the
# form nsys' own "Version number is invalid: 2025@5@1@..." quotes), or "2022.4.2.1" in 2022.
AT_FORM = re.compile(rb"(20\d\d)@(\d{1,2})@(\d{1,3})")
DOTTED_FORM = re.compile(rb"(20\d\d)\.(\d{1,2})\.(\d{1,3})\.\d+")  # four parts: not a date
HEADER_BYTES = 1 << 16


def recorded_version(report: Path) -> str | None:
    """'2025.5.1': the nsys that recorded an .nsys-rep, read from its first bytes; for a .sqlite,
    the nsys that exported it (EXPORT_PRODUCT_VERSION). None where neither is found."""
    if report.suffix == ".sqlite":
        return _export_version(report)
    try:
        with open(report, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError:
        return None
    found = AT_FORM.search(head) or DOTTED_FORM.search(head)
    return ".".join(part.decode() for part in found.groups()) if found else None


def _export_version(export: Path) -> str | None:
    try:
        with closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # nsys 2023 on / before
                if table in tables:
                    row = db.execute(f"SELECT value FROM {table} WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()
                    return row[0] if row else None
    except sqlite3.DatabaseError:
        return None
    return None


SQLITE_HEADER = b"SQLite format 3\x00"


def again(export: Path) -> str:
    """How to replace a bad export: nsys export keeps a file already there ("File already exists")
    unless told to overwrite it, so the command says so; where the report lies beside the export, with
    its names."""
    beside = next((r for r in map(export.with_suffix, REPORT_SUFFIXES) if r.is_file()), None)
    if beside is None:
        return ("export the .nsys-rep again over it (nsys export --type sqlite --force-overwrite=true REPORT) "
                "or record the run again")
    return (f"export {beside.name} again over it (nsys export --type sqlite --force-overwrite=true --output "
            f"{shlex.quote(str(export))} {shlex.quote(str(beside))}), or move {export.name} away and run the report "
            f"again: it exports {beside.name} afresh")


def export_problem(export: Path) -> str | None:
    """What is wrong with a file given as an nsys SQLite export, as the start of a one-line error
    naming it: empty, not SQLite at all, or shorter than its header says (cut off while written or
    copied). None when it looks whole; the tables are read later (trace.load_trace)."""
    try:
        size = export.stat().st_size
        with open(export, "rb") as f:
            head = f.read(100)
    except OSError as err:
        return f"{export} cannot be read ({err.strerror}); check its permissions"
    if size == 0:
        return f"{export} is empty (0 bytes): its export or copy stopped before writing; {again(export)}"
    if not head.startswith(SQLITE_HEADER):
        return (f"{export} is not SQLite (not an nsys SQLite export at all); pass the .nsys-rep, or the .sqlite "
                "that nsys export wrote from it")
    # The header's page count is valid when its version-valid-for number matches the change counter.
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big") if head[92:96] == head[24:28] else 0
    if len(head) < 100 or size < page * pages:
        return (f"{export} is truncated ({size} of the {page * pages} bytes its SQLite header says): it was cut "
                f"off while written or copied; {again(export)}")
    return None


# Tables every nsys export holds whatever was traced (its strings, the target's facts, the session);
# an SQLite file with none of them is another program's database, not an export.
NSYS_TABLES = ("StringIds", "ANALYSIS_DETAILS", "META_DATA_EXPORT", "EXPORT_META_DATA", "ThreadNames", "PROCESSES")
NSYS_PREFIXES = ("TARGET_INFO_", "ENUM_", "NVTX_", "CUPTI_ACTIVITY_KIND_")


def not_an_export(export: Path, tables: set[str]) -> str | None:
    """The one-line error for an SQLite file that holds none of nsys's own tables; None for an export."""
    if any(t in NSYS_TABLES or t.startswith(NSYS_PREFIXES) for t in tables):
        return None
    held = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "") if tables else "no tables at all"
    return (f"{export} is an SQLite database but not an nsys export (none of nsys's tables, such as StringIds, "
            f"TARGET_INFO_* or ANALYSIS_DETAILS, is in it: it holds {held}); pass the .nsys-rep, or the .sqlite that "
            "nsys export wrote from it")


def _tables(export: Path) -> set[str]:
    with open_export(export) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


@contextmanager
def open_export(export: Path):
    """The export opened read-only. SQLite's complaint about the file, from any read inside the
    block (the trace, the machine, the clock), becomes one line naming it (export_error)."""
    try:
        with closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
            yield db
    except sqlite3.DatabaseError as err:
        raise UserError(export_error(export, err)) from None


def damaged(export: Path, found: str) -> str:
    """found: SQLite's words for the damage (an error, or quick_check's first finding), on one line."""
    found = " ".join(found.replace("*** in database main ***", "").split())
    return f"{export} is truncated or damaged, not a readable nsys SQLite export (SQLite: {found}); {again(export)}"


SQLITE_MAX_PATH = 512  # SQLite's own limit on a file's path (SQLITE_MAX_PATHNAME), below the system's


def export_error(export: Path, err: sqlite3.DatabaseError) -> str:
    """A damaged page (SQLITE_CORRUPT, NOTADB) reads as damaged; a failed read of the disk as that;
    anything else (a missing table or column) as an export this nsys-free reader cannot read."""
    kind = getattr(err, "sqlite_errorname", "")
    return _error_line(export, str(err), "damaged" if kind.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) else
                       "path" if kind.startswith("SQLITE_CANTOPEN") else
                       "disk" if kind.startswith(("SQLITE_IOERR", "SQLITE_PERM", "SQLITE_READONLY")) else "schema")


# SQLite's own words for each kind (sqlite3.c's sqlite3ErrStr), for a reader that gets the message
# without its code: connectorx's RuntimeError (sql_columns.py)
WORDS = (("damaged", ("malformed", "not a database", "corrupt")), ("path", ("unable to open",)),
         ("disk", ("disk I/O error", "access permission denied", "readonly")))


def message_error(export: Path, message: str) -> str:
    """export_error's line from SQLite's message alone."""
    return _error_line(export, message, next((kind for kind, words in WORDS if any(w in message for w in words)),
                                             "schema"))


def _error_line(export: Path, message: str, kind: str) -> str:
    if kind == "damaged":
        return damaged(export, message)
    length = len(os.fsencode(str(export.absolute())))
    if kind == "path" and length > SQLITE_MAX_PATH:
        return (f"{export} cannot be opened: its path is {length} bytes long, past the {SQLITE_MAX_PATH} SQLite "
                "opens; move it (or its folder) to a shorter path")
    if kind in ("path", "disk"):
        return f"{export} cannot be read (SQLite: {message}); check the file, its permissions and its disk"
    return (f"{export} lacks a table or column that nsys exports hold (SQLite: {message}); pass the .sqlite that "
            f"nsys export wrote, unedited, or {again(export)}")


def release(version: str | None) -> tuple[int, ...]:
    """(2025, 5, 1) from '2025.5.1' or '2022.4.2.1-df9881f'; () when unreadable."""
    found = re.match(r"(\d{4})\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(g) for g in found.groups() if g is not None) if found else ()


def open_with(version: str | None) -> str | None:
    """The line a summary prints: which Nsight Systems opens the report."""
    parts = release(version)
    return f"open it with Nsight Systems {parts[0]}.{parts[1]} or newer" if len(parts) >= 2 else None


def too_new(report: Path, reason: str) -> str | None:
    """The one-line error for a report newer than the local nsys; None when it is not newer."""
    recorded = recorded_version(report)
    if recorded is None and (found := AT_FORM.search(reason.encode())):
        recorded = ".".join(part.decode() for part in found.groups())
    local = nsys_version()
    if not recorded or not local or release(recorded)[:3] <= release(local)[:3]:
        return None
    parts = release(recorded)
    return (f"{report} was recorded by nsys {recorded}, newer than this machine's nsys {local}; export it with "
            f"nsys {parts[0]}.{parts[1]} or newer (`nsys export --type sqlite {report}`, also on a laptop), "
            "then pass the .sqlite")


def sqlite_export(report: Path, out_dir: Path) -> Path:
    """The report as SQLite in out_dir; an export newer than the report, there or next to
    the report, is reused."""
    if not report.is_file():
        raise UserError(f"{report} does not exist; record one with scripts/launch.sh "
                        "or pass the path of an .nsys-rep file")
    if report.suffix == ".sqlite":
        return report
    if report.stat().st_size == 0 and report.suffix in REPORT_SUFFIXES:
        raise UserError(f"{report} is empty (0 bytes): nsys stopped before writing it; record the run again")
    if report.suffix == ".qdstrm":
        raise UserError(f"{report} is {UNFINISHED}")
    if report.suffix not in REPORT_SUFFIXES:
        raise UserError(f"{report} is not an Nsight Systems report; pass the .nsys-rep "
                        "written by nsys profile (or its .sqlite export)")
    target = out_dir / f"{report.stem}.sqlite"
    for existing in (report.with_suffix(".sqlite"), target):
        if existing.is_file() and existing.stat().st_mtime >= report.stat().st_mtime:
            if problem := export_problem(existing) or not_an_export(existing, _tables(existing)):
                raise UserError(f"{problem.split('; ')[0]}, and, newer than {report.name} beside it, it is taken as "
                                f"that report's export; move it away, and the report exports {report.name} afresh")
            return existing
    out_dir.mkdir(parents=True, exist_ok=True)
    # Export under a temporary name so an interrupted export is never reused as fresh.
    partial = out_dir / f"{report.stem}.partial.sqlite"
    if len(os.fsencode(partial.name)) > os.pathconf(out_dir, "PC_NAME_MAX"):  # nsys would call the report damaged
        raise UserError(f"{too_long(partial)}: it is the export's name for {report.name}; rename the report shorter")
    try:
        result = subprocess.run(
            [nsys_executable(), "export", "--type=sqlite", "--force-overwrite=true", "--quiet=true",
             f"--output={partial}", str(report)], capture_output=True, text=True)
    except BaseException:  # Ctrl-C or a failed start: no half-written export stays behind
        partial.unlink(missing_ok=True)
        raise
    if result.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        lines = (result.stderr + result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"nsys export exited with {result.returncode}"
        newer = too_new(report, result.stderr + result.stdout)
        if newer:
            raise UserError(newer)
        raise UserError(f"nsys could not read {report} ({reason}): it is damaged, cut off, or not from a finished "
                        "nsys profile run; copy it again from where it was recorded, or record the run again (a "
                        "crashed nsys leaves only a .qdstrm)")
    os.replace(partial, target)
    return target
