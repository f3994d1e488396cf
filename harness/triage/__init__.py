"""Triage: failure signatures, runs compared (outputs, memory, speed, upstream's suite) and which runs to compare."""
