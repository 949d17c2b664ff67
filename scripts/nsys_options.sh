# Options for `nsys profile`, sourced by scripts/launch.sh and the profiling tests
# so that tests profile exactly what the lab runs (DESIGN.md §5).
#
# CPU IP sampling and context-switch tracing are off. The analysis reads only
# NVTX ranges and CUDA activity; sampling is most of a report's bulk and of the
# intermediate .qdstrm in $TMPDIR (the unbounded default once wrote 2 GB for a
# tiny script). Measured with nsys 2022.4 on a 2-process gloo CPU run of 14 s:
#   defaults:                        report 1.9 MB, intermediate 107 MB
#   --sample=none:                   report 1.2 MB, intermediate  20 MB
#   --sample=none --cpuctxsw=none:   report 0.7 MB, intermediate  20 MB
# Turn sampling back on by hand (--sample=process-tree) for a CPU hot-spot hunt.
NSYS_PROFILE_OPTS=(
    --trace=cuda,cublas,cudnn,nvtx,osrt
    --sample=none
    --cpuctxsw=none
    --force-overwrite=true
)
