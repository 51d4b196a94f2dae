"""The torch side: the data set, the loader, resume state, the shared epoch end, batch
transfer, mixtures. Only this package (and what it imports lazily) needs torch."""
