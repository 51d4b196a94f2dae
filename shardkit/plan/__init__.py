"""Who reads what, in which order: pure functions of the manifest, seed, epoch, rank and
worker (no I/O)."""
