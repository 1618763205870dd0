"""math ops."""
