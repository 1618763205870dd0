"""Caffe2's Python op (`net.Python(f)`): a Python function run on the host between jitted segments.

`f(inputs, outputs)` gets the input blobs and the outputs as Caffe2's TensorCPU-like objects: `.data`
(a NumPy array; writable for outputs), `.shape`, `.reshape(shape)`, `.feed(array)`. Functions are kept
in this process by token, as Caffe2 kept them; a net holding a token from another process cannot run.
`PythonGradient` runs `grad_f` with the forward inputs, outputs and output gradients as inputs.
Both are host ops of the op registry; this module builds on no other module of the Caffe2 API (what
`pass_workspace` hands `f` is made by the caller of `register_python_function`, `core.Net.Python`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ...errors import BadArgumentError
from ...ops.facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from ...ops.gradient_makers import GradientContext, gradient_op
from ...ops.registry import declare_family, facet, find_host, register_host_op

WorkspaceView = Callable[[Any], Any]  # the running workspace -> what a `pass_workspace` function gets
_FUNCTIONS: dict[str, tuple[Callable, Callable | None, WorkspaceView | None]] = {}
_tokens = itertools.count()


def register_python_function(
    f: Callable, grad_f: Callable | None, python_func_type: Any, workspace_view: WorkspaceView | None
) -> str:
    """Keep `f` (and `grad_f`) under a new token, as Caffe2's `_RegisterPythonImpl` did. With a
    `workspace_view` (Caffe2's `pass_workspace`), they get a third argument: that view of the workspace
    running the op."""
    if python_func_type is not None:
        func = python_func_type(f)
        f, grad_f = func.forward, func.backward
    else:
        if isinstance(f, tuple):
            f = f[0](*f[1], **f[2])
        if isinstance(grad_f, tuple):
            grad_f = grad_f[0](*grad_f[1], **grad_f[2])
    token = f"python_op:{next(_tokens)}"
    _FUNCTIONS[token] = (f, grad_f, workspace_view)
    return token


def register_gradient_function(token: str, grad_f: Callable) -> None:
    """Give the Python op `token` its gradient function, after the fact (Caffe2's C extension registered the
    two separately: `register_python_op`, then `register_python_gradient_op`)."""
    if token not in _FUNCTIONS:
        raise BadArgumentError(f"register_python_gradient_op: no Python op was registered as '{token}'")
    f, _, workspace_view = _FUNCTIONS[token]
    _FUNCTIONS[token] = (f, grad_f, workspace_view)


class TensorCPU:
    """A blob as a Python op sees it."""

    def __init__(self, value: Any):
        self.data = np.array(value, copy=True) if value is not None else np.zeros((0,), np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def reshape(self, shape: Any) -> None:
        shape = tuple(int(d) for d in shape)
        if self.data.shape != shape:
            self.data = np.zeros(shape, dtype=self.data.dtype if self.data.size else np.float32)

    def feed(self, array: Any) -> bool:
        self.data = np.array(array, copy=True)
        return True

    def fetch(self) -> np.ndarray:
        return self.data

    def _reshape(self, shape: Any) -> None:
        self.reshape(shape)


def _function(op: Any, gradient: bool) -> tuple[Callable, WorkspaceView | None]:
    token = op.str("token", "")
    entry = _FUNCTIONS.get(token)
    if entry is None:
        raise BadArgumentError(
            f"{op.where}: Python op token '{token}' was not registered in this process "
            "(Python ops run functions defined by the script that built the net)"
        )
    f, grad_f, workspace_view = entry
    if gradient:
        if grad_f is None:
            raise BadArgumentError(f"{op.where}: the Python op was registered without a gradient function")
        return grad_f, workspace_view
    return f, workspace_view


def _run(gradient: bool) -> Callable:
    def run(workspace: Any, op: Any, state: dict[str, Any]) -> None:
        f, workspace_view = _function(op, gradient)
        inputs = [TensorCPU(np.asarray(workspace.get(name, op))) for name in op.inputs]
        outputs = []
        for name in op.outputs:
            value = workspace.get(name, op) if workspace._has_value(name) else None
            outputs.append(TensorCPU(np.asarray(value) if isinstance(value, jax.Array | np.ndarray) else None))
        if workspace_view is not None:
            f(inputs, outputs, workspace_view(workspace))
        else:
            f(inputs, outputs)
        for name, tensor in zip(op.outputs, outputs, strict=True):
            workspace.feed(name, tensor.data)

    return run


# The Python op's builder gradient maker is `_python_gradient` below, attached to its record.
declare_family(__name__, roles=NO_ROLES, shape_rule=HOST_OP_NO_SHAPE_RULE, emitter=HOST_OP_NO_EMITTER)
if find_host("Python") is None:
    register_host_op("Python", _run(gradient=False))
    register_host_op("PythonGradient", _run(gradient=True), gradient=Absent("no builder gradient maker"))


@facet("gradient", "Python")
def _python_gradient(g: GradientContext) -> list:
    """Caffe2's GetPythonGradient: inputs, outputs and (selected) output gradients in; input gradients out."""
    outputs_arg = g.arg("grad_output_indices")
    inputs_arg = g.arg("grad_input_indices")
    grad_outputs = list(outputs_arg.ints) if outputs_arg is not None and outputs_arg.ints else range(len(g.op.output))
    grad_inputs = list(inputs_arg.ints) if inputs_arg is not None and inputs_arg.ints else range(len(g.op.input))
    inputs = [*g.op.input, *g.op.output, *(g.GO(i) for i in grad_outputs)]
    return [gradient_op("PythonGradient", inputs, [g.GI(i) for i in grad_inputs])]
