"""array ops."""
