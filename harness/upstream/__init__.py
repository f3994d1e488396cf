"""Upstream tracking: the series forecast on another upstream commit, and the roll that moves the pin there."""
