#!/usr/bin/env bash
# The profile report and the lab page on a laptop: a venv with only requirements-report.txt
# (numpy, matplotlib; no torch) summarises a real export in tests/data and writes the lab page
# over a kit-layout folder of it. Fails if torch is importable there or a page is missing.
# CI runs it (.ci/run). Usage: scripts/laptop_report.sh   PYTHON_BOOTSTRAP (python3)   LAPTOP_VENV (.venv-report)
set -uo pipefail
cd "$(dirname "$0")/.."
say() { echo "laptop report: $*"; }
venv="${LAPTOP_VENV:-.venv-report}"
req=requirements-report.txt

stamp="$venv/.installed-$(sha1sum "$req" | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    . scripts/free_space.sh
    room_for "laptop report" "$venv" 1 1 || exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv with $("${PYTHON_BOOTSTRAP:-python3}" --version)"
    "${PYTHON_BOOTSTRAP:-python3}" -m venv "$venv" || exit 1
fi
if [ ! -f "$stamp" ]; then
    say "installing $req into $venv (first time only)"
    "$venv/bin/python" -m pip install -q -r "$req" || { say "FAIL: could not install $req"; exit 1; }
    touch "$stamp"
fi
if "$venv/bin/python" -E -c 'import torch' >/dev/null 2>&1; then
    say "FAIL: torch is importable in $venv; the report must run without it (rebuild $venv from $req alone)"
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export_file=tests/data/nsys/ddp_dali_cpu_nsys2022.4.sqlite
# -E: no PYTHONPATH, so a torch installed elsewhere cannot slip in (a venv never reads the user site)
run() { "$venv/bin/python" -E -m handler.profiling.report "$@" >"$work/log" 2>&1 || { cat "$work/log"; return 1; }; }
failed=0
if run "$export_file" --out "$work/one" && [ -s "$work/one/ddp_dali_cpu_nsys2022.4.summary.md" ]; then
    say "PASS: summary of $export_file"
else
    say "FAIL: no summary of $export_file"; failed=1
fi
mkdir -p "$work/logs/ddp_dali_20251001_173341"
cp "$export_file" "$work/logs/ddp_dali_20251001_173341/gpu_1.sqlite"
if run "$work/logs" --lab --out "$work/lab" && [ -s "$work/lab/lab.md" ] && [ -s "$work/lab/ddp_dali_1cpu.png" ]; then
    say "PASS: lab page over the kit's layout"
else
    say "FAIL: no lab page (lab.md and its figure)"; failed=1
fi
exit $failed
