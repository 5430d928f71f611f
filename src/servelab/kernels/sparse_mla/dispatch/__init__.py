"""Which split kernel runs for a call, launching it and its merge, and the record of what ran
(reads defaults/<gpu>.toml). Imports splitkv/ and, on first use, the kernel modules."""
