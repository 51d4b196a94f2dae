"""Writing shard sets: the shard writer, build sources and the parallel, resumable build."""
