"""The stages, in the order a run takes them: source, patches, build (cross, cuda_compile), native_tests, then the greedy comparisons (greedy, engine, compare, divergence, upstream_support)."""
