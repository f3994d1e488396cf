"""Before anything runs: the base source, the patch series, the builds (native, cross, the CUDA compile
step), what cannot run refused, the compile step's cache, the quantize tool."""
