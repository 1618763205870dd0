"""sparse ops."""
