"""reduction."""
