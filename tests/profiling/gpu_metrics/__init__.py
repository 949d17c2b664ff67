"""The GPU-metrics reader's tests: both export layouts, the real 2022.x export, the device map."""
