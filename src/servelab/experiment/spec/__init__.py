"""The experiment file: its typed model, the sweep and placement keys, the metrics it may
decide on, and parsing (a file, or a spec read back from a store). The bottom of experiment/:
imports nothing else of it."""
