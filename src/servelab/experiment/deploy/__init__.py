"""Bringing processes up and down: on this host or on a Ray cluster's nodes, with free ports,
readiness and a teardown that leaves nothing behind. Knows nothing of experiment files: it
takes the engines' ProcessConfigs."""
