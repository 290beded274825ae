"""The one writer of results/: published files, OSV records, OpenVEX statements."""
