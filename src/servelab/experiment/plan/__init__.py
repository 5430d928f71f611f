"""What an experiment would do, decided before anything launches: each arm's processes, the
pre-flight checks, the Ray node each process would land on, the run schedule and `run --check`.
Imports design/ and deploy/ (to render commands as a deployment would)."""
