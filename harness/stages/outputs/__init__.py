"""The greedy comparisons: the engine and llama-completion runs, their token streams compared, and
their result cache; and generations under compute-sanitizer (sanitized_generation.py)."""
