"""The documents the pipeline writes and reads: results, receipts, upstream results, published sums."""
