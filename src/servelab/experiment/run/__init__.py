"""Running an experiment: the runner, what it measures (load points, capacity sweeps), the
record of each run, the machine's interference and core pinning. Imports plan/, deploy/,
stats/ (when to stop) and design/."""
