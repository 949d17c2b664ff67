# Options for `nsys profile`, sourced by scripts/launch.sh and by the profiling tests, so
# the tests profile exactly what the lab runs (DESIGN.md §5).
#
# CPU sampling and context-switch tracing are off:
# - The analysis reads only NVTX ranges and CUDA activity.
# - Sampling is most of a report's bulk and of the intermediate .qdstrm in $TMPDIR.
#   A tiny script once wrote 2 GB with the defaults.
# - Both features open perf events. After the application exited, nsys 2022.4's agent
#   sometimes busy-polled those events forever, so the report was never written.
#
# Measured on a 2-rank CPU run of tests/test_launch.py's configuration:
#   defaults  2.7 MB report, 150 MB intermediate
#   these     1.0 MB report,  30 MB intermediate
# docs/PROFILING.md has the details.
NSYS_PROFILE_OPTS=(
    --trace=cuda,cublas,cudnn,nvtx,osrt
    --sample=none
    --cpuctxsw=none
    --force-overwrite=true
)
