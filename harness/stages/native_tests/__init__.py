"""The fork's native tests through ctest, by label, and their result cache."""
