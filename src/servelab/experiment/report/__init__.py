"""What an experiment says: its evidence as markdown and HTML (tables, plots, trade-off charts,
the noise story, a decision record) and `servelab compare`. Reads typed results from stats/,
never recomputes them."""
