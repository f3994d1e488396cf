"""What a run does, one folder per role in the order of the run: building/, native_tests/, outputs/, checks/, speed/;
every stage has the one shape of shape.py, and table.py lists them in order (docs/layout.md)."""
