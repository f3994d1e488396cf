"""What a run is given: ``matrix.yaml`` loaded and validated (config.py, against matrix.schema.json) and the models it names (models.py)."""
