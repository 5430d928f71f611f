"""`servelab router`: a prefill/decode router with sglang_router's flags, run as its own
process. Imports nothing else of servelab.mini. Light: the pre-flight imports router.args."""
