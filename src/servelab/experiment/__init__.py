"""Controlled experiments: a file of arms over a base configuration, run interleaved, stored run
by run, summarized with bootstrap confidence intervals, reported as markdown and HTML."""
