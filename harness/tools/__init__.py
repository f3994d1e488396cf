"""Commands beside the pipeline: benchmarks, the CI job matrix, the Windows path budget and compile check."""
