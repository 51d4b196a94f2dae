"""A build's inputs: source arguments discovered into units (folders, JSONL, tables, tar
shards, a build function's inputs) and units read into samples."""
