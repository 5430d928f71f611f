"""The HTTP server around one engine: the app and its route modules (routes/), request
validation (protocol), /metrics, the typed flags of `servelab serve` (args), and the server's
prefill/decode role with its network side (pd/). Imports engine/ and model/. Light: the
pre-flight imports server.args without paying for torch or FastAPI."""
