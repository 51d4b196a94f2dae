"""The manifest: its model, its checks, the build's journal and the compact columnar forms."""
