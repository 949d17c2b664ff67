# Sourced by scripts/launch.sh. A new run never destroys an earlier run's results
# (docs/PROFILING.md, "Earlier runs"): the newest run keeps the lab's file names in
# NSIGHT_LOG_DIR, and the files an earlier run left under the same name move first to
# NSIGHT_LOG_DIR/earlier/<name>/<time>/, <time> being when that run wrote them. nsys's
# --force-overwrite then never finds anything to overwrite.

# Every file a launch leaves under one name: nsys's report (.qdrep before nsys 2021.4, .qdstrm
# when it crashed), its SQLite export, the metrics and the profile summary.
EARLIER_SUFFIXES=(nsys-rep qdrep qdstrm sqlite metrics.json summary.md summary.json)

# move_earlier_run DIR NAME: moves DIR/NAME.<suffix> aside and prints the folder they went to
# (nothing when there were none).
move_earlier_run() {
    local dir="$1" name="$2" files=() suffix oldest dest
    for suffix in "${EARLIER_SUFFIXES[@]}"; do
        [[ -e "$dir/$name.$suffix" ]] && files+=("$dir/$name.$suffix")
    done
    [[ ${#files[@]} -gt 0 ]] || return 0
    # The oldest of them: the summary and the SQLite export come after the run.
    oldest="$(ls -tr -- "${files[@]}" | head -n 1)"
    dest="$dir/earlier/$name/$(date -r "$oldest" +%Y%m%d-%H%M%S)"
    [[ -e "$dest" ]] && dest="$dest-$$"
    mkdir -p -- "$dest" && mv -- "${files[@]}" "$dest/" && echo "$dest"
}
