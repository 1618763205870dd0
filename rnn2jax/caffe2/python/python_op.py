"""Caffe2's Python op (`net.Python(f)`): a Python function run on the host between jitted segments.

`f(inputs, outputs)` gets the input blobs and the outputs as Caffe2's TensorCPU-like objects: `.data`
(a NumPy array; writable for outputs), `.shape`, `.reshape(shape)`, `.feed(array)`. Functions are kept
in this process by token, as Caffe2 kept them; a net holding a token from another process cannot run.
An op may instead carry a pickled `(func, args, kwargs)` builder (`pickled_builder`, Caffe2's distributed
form): each created net builds its own function from it. `PythonGradient` runs `grad_f` with the forward
inputs, outputs and output gradients as inputs. What `f` raises surfaces as itself, as in Caffe2.
`PythonDLPack` (and `PythonDLPackGradient`) run the same functions, handing them the blobs as Caffe2's
DLPackTensorCPU objects instead: `.data` is a DLPack capsule of the blob, `.feed(capsule)` sets it from one,
`._shape` and `._reshape(shape)`. All four are host ops of the op registry; this module builds on no other
module of the Caffe2 API (what `pass_workspace` hands `f` is made by the caller of `register_python_function`,
`core.Net.Python`, or for built functions `default_workspace_view`, which the workspace module sets).
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ...errors import BadArgumentError
from ...ops.facets import HOST_OP_NO_EMITTER, HOST_OP_NO_SHAPE_RULE, NO_ROLES, Absent
from ...ops.gradient_makers import GradientContext, gradient_op
from ...ops.registry import declare_family, facet, find_host, register_host_op
from ...ops.waits import runs_unlocked

WorkspaceView = Callable[[Any], Any]  # the running workspace -> what a `pass_workspace` function gets
_FUNCTIONS: dict[str, tuple[Callable, Callable | None, WorkspaceView | None]] = {}
# what a `pass_workspace` function gets, for ops built from a pickled builder (set by the workspace module,
# which makes Caffe2's `C.Workspace` objects)
default_workspace_view: WorkspaceView | None = None


def register_python_function(
    f: Callable,
    grad_f: Callable | None,
    python_func_type: Any,
    workspace_view: WorkspaceView | None,
    name: str = "",
) -> str:
    """Keep `f` (and `grad_f`) under a new token, as Caffe2's `register_python_op` did: the token is
    `name:` (when given) and the function's name, then that with `:1`, `:2`, ... appended. With a
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
    if f is None:
        raise BadArgumentError("register_python_op: func is None")
    name = (f"{name}:" if name else "") + str(getattr(f, "__name__", type(f).__name__))
    token, suffix = name, itertools.count(1)
    while token in _FUNCTIONS:
        token = f"{name}:{next(suffix)}"
    _FUNCTIONS[token] = (f, grad_f or None, workspace_view)
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


class _Capsule:
    """A DLPack capsule as NumPy's `from_dlpack` takes it (an object with `__dlpack__`), on the CPU."""

    def __init__(self, capsule: Any):
        self.capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0


class DLPackTensorCPU:
    """A blob as a PythonDLPack op sees it (Caffe2's DLPackWrapper over a CPU tensor)."""

    def __init__(self, value: Any, where: str, name: str):
        self.array = np.array(value, copy=True) if value is not None else None
        self._where, self._name = where, name

    @property
    def data(self) -> Any:
        """A DLPack capsule ("dltensor") of the blob, sharing its memory: a consumer that writes to it (torch)
        writes the blob. An empty or unset blob is a float32 tensor of shape (0,), as in Caffe2; a 0-d blob
        and a string blob cannot be passed (Caffe2: the tensor must have a dim; the type is not in DLPack)."""
        if self.array is None or self.array.size == 0:
            self.array = np.zeros((0,), self.array.dtype if self.array is not None else np.float32)
        if self.array.ndim == 0 or self.array.dtype == object:
            what = "a 0-d tensor" if self.array.ndim == 0 else f"a {self.array.dtype} tensor"
            raise BadArgumentError(f"{self._where}: blob '{self._name}' is {what}, which DLPack cannot pass")
        return self.array.__dlpack__()

    def feed(self, capsule: Any) -> None:
        """Set the blob to a copy of the tensor a DLPack capsule holds (a CPU tensor of standard strides)."""
        if type(capsule).__name__ != "PyCapsule":
            raise BadArgumentError(
                f"{self._where}: blob '{self._name}': Expected DLPack capsule, got {type(capsule).__name__} (pass "
                "x.__dlpack__() or torch.utils.dlpack.to_dlpack(x))"
            )
        try:
            self.array = np.array(np.from_dlpack(_Capsule(capsule)), copy=True)
        except (BufferError, TypeError, ValueError, RuntimeError) as error:
            raise BadArgumentError(f"{self._where}: blob '{self._name}': Invalid DLPack capsule: {error}") from None

    @property
    def _shape(self) -> list[int]:
        return [] if self.array is None else list(self.array.shape)

    def _reshape(self, shape: Any) -> None:
        """Caffe2's Resize: the dtype stays (float32 for an unset blob); the values are undefined (here 0)
        unless the shape is the same."""
        shape = tuple(int(d) for d in shape)
        if self.array is None or self.array.shape != shape:
            self.array = np.zeros(shape, self.array.dtype if self.array is not None else np.float32)


def _function(op: Any, gradient: bool, state: dict[str, Any]) -> tuple[Callable, WorkspaceView | None]:
    """The function the op runs: built from its pickled builder (once per created net, kept in `state`, as
    Caffe2 built it once per op instance), else the one registered under its token."""
    if "function" in state:
        return state["function"]
    builder = op.args.get("pickled_grad_builder" if gradient else "pickled_builder")
    if builder is not None and builder.kind == "s" and builder.value:
        state["function"] = _build(op, builder.name, builder.value)
        return state["function"]
    token = op.str("token", "")
    entry = _FUNCTIONS.get(token)
    if entry is None:
        if not token:
            raise BadArgumentError(f"{op.where}: PythonOp requires either pickled_builder or token arg.")
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


def _build(op: Any, arg_name: str, pickled: str | bytes) -> tuple[Callable, WorkspaceView | None]:
    """Caffe2's `(func, args, kwargs)` builder, pickled by `Net.Python`: `func(*args, **kwargs)` is the
    function. What the builder raises surfaces as itself, as in Caffe2 (which builds when the net is
    created; here the first run builds)."""
    data = pickled.encode("utf-8") if isinstance(pickled, str) else pickled
    try:
        func, args, kwargs = pickle.loads(data)
        built = func(*args, **kwargs)
    except Exception as error:
        error.add_note(f"{op.where}: Python exception encountered while creating PythonOp (from '{arg_name}')")
        raise
    # Caffe2 reads `pass_workspace` for a built function, the gradient's too (its op copies the arguments)
    return built, default_workspace_view if op.bool("pass_workspace", False) else None


def _run(gradient: bool, dlpack: bool = False) -> Callable:
    def run(workspace: Any, op: Any, state: dict[str, Any]) -> None:
        def wrap(value: Any, name: str) -> TensorCPU | DLPackTensorCPU:
            return DLPackTensorCPU(value, op.where, name) if dlpack else TensorCPU(value)

        f, workspace_view = _function(op, gradient, state)
        inputs = [wrap(np.asarray(workspace.get(name, op)), name) for name in op.inputs]
        outputs = []
        for name in op.outputs:
            value = workspace.get(name, op) if workspace._has_value(name) else None
            outputs.append(wrap(np.asarray(value) if isinstance(value, jax.Array | np.ndarray) else None, name))
        if workspace_view is not None:
            f(inputs, outputs, workspace_view(workspace))
        else:
            f(inputs, outputs)
        for name, tensor in zip(op.outputs, outputs, strict=True):
            value = tensor.array if dlpack else tensor.data
            if value is not None:
                workspace.feed(name, value)

    return run


# The Python op's builder gradient maker is `_python_gradient` below, attached to its record.
declare_family(__name__, roles=NO_ROLES, shape_rule=HOST_OP_NO_SHAPE_RULE, emitter=HOST_OP_NO_EMITTER)
if find_host("Python") is None:
    register_host_op("Python", _run(gradient=False))
    register_host_op("PythonGradient", _run(gradient=True), gradient=Absent("no builder gradient maker"))
    register_host_op("PythonDLPack", _run(gradient=False, dlpack=True))
    register_host_op(
        "PythonDLPackGradient", _run(gradient=True, dlpack=True), gradient=Absent("no builder gradient maker")
    )
# the caller's Python may wait on another thread (a queue it fills): it runs without the op lock
runs_unlocked("Python", "PythonGradient", "PythonDLPack", "PythonDLPackGradient")


@facet("gradient", "Python", "PythonDLPack")
def _python_gradient(g: GradientContext) -> list:
    """Caffe2's GetPythonGradient: inputs, outputs and (selected) output gradients in; input gradients out
    (PythonGradient, or PythonDLPackGradient for PythonDLPack)."""
    outputs_arg = g.arg("grad_output_indices")
    inputs_arg = g.arg("grad_input_indices")
    grad_outputs = list(outputs_arg.ints) if outputs_arg is not None and outputs_arg.ints else range(len(g.op.output))
    grad_inputs = list(inputs_arg.ints) if inputs_arg is not None and inputs_arg.ints else range(len(g.op.input))
    inputs = [*g.op.input, *g.op.output, *(g.GO(i) for i in grad_outputs)]
    return [gradient_op(f"{g.op.type}Gradient", inputs, [g.GI(i) for i in grad_inputs])]
