"""A cell end to end: run a probe in a cell environment, write its result and receipt."""
