"""What every split-KV launcher reads: the launch plan, the split geometry, the merge kernel and
the lab switches. Imports only the package's reference (input checks) and fp8 (the cache type)."""
