"""Caffe2 ops as JAX functions: the registry and one module per op family."""

from .registry import REGISTRY, OpDef, check_supported, lookup, register, supported, unsupported_ops

__all__ = ["REGISTRY", "OpDef", "check_supported", "lookup", "register", "supported", "unsupported_ops"]
