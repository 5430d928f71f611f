"""Controlled experiments: a file of arms over a base configuration, run interleaved, stored run
by run, summarized with bootstrap confidence intervals, reported as markdown and HTML.

The folders are the layers, imports run one way: design/ (the experiment file) at the bottom;
deploy/ (processes up and down) beside it; plan/ -> design, deploy; stats/ -> design; run/ ->
plan, deploy, stats, design; report/ -> stats, design; present.py and demo.py are the faces on
top."""
