"""Gradient makers of the embedding ops."""
