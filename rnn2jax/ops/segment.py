"""segment ops."""
