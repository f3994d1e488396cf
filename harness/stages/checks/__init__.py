"""Checks that judge what the comparisons recorded: placement, pinning, mmap and warnings per configuration."""
