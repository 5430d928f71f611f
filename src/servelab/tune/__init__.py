"""TUNE kernels for the GPU at hand: search spaces as data, timing, searches, workers, checkpoint,
and the engines' config-file formats. See docs/TUNING.md."""
