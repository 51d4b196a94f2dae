"""``python -m shardkit`` runs the CLI."""

from shardkit.cli import main

main()
