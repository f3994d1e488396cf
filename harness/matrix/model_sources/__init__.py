"""Model sources, declared once: one module per ``kind`` of matrix.yaml's ``models`` (pypi_chunks.py,
synthetic_moe.py, quantized.py, file.py), each a :class:`~.shape.ModelSource` listed in registry.py, which also
holds what every kind is asked through (obtain a model, find one already made, its identity, the store).

A new model kind is its module, its line in registry.py and its schema in matrix.schema.json; the work of
each kind (assembling, generating, quantizing, summarising a GGUF file) stays in harness.matrix.models.
"""
