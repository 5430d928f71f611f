"""servelab: a laboratory for methodical LLM-serving optimization."""

__version__ = "0.1.0"
