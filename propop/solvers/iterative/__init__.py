"""iterative."""
