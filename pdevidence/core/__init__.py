"""Ground floor: exit codes and errors, paths, locks, child processes, files."""
