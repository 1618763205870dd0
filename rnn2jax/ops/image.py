"""image ops."""
