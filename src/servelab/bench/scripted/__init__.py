"""The scripted test server: a loopback LLM server with scripted timings and failures
(server.py, run as `python -m servelab.bench.scripted`), what it does with each request
(script.py) and running it from Python (harness.py)."""
