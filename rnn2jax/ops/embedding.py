"""embedding ops."""
