"""Platform kinds, declared once: one module per GPU kind (cpu.py for ``gpu: none``, nvidia.py, with the
engine's page-locked query in nvidia_probe.h) and per OS (linux.py, windows.py), each a record of the one shape
of shape.py, listed in registry.py.

A new kind is its module, its line in registry.py, its value in matrix.schema.json's enum and its
platforms in matrix.yaml (docs/layout.md, "Adding a platform kind").  This package imports nothing of
the harness but itself: the run record (harness.record) and the matrix read it.
"""
