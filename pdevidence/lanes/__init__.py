"""Lanes beyond the matrix: release sweep, drift, mutation, check, the PRs' own tests."""
