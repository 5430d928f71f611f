"""The statistics of an experiment: the bootstrap and the verdict rule (one copy), the
analysis per metric, SLO-capacity statistics, adaptive repetitions and the evidence (which
stored runs count). Imports design/ only."""
