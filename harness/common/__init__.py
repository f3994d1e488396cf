"""Shared by every part of the package: exceptions and exit codes, child processes, file-system problems, locks, console output."""
