"""direct."""
