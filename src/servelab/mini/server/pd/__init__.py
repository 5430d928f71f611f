"""Prefill/decode disaggregation on the network: the server's role (what a request needs before
it reaches the engine), the bootstrap server and fetch of KV, and the KV handoff's wire format."""
