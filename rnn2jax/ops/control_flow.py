"""Caffe2's control-flow ops, which carry nets: If, While, Do, ONNXWhile, CreateScope, HasScope.

Caffe2 runs `If`'s then_net/else_net and `While`'s loop_net/cond_net in the op's own workspace: they read any
blob of it and what they write stays there, declared among the op's outputs or not. Here the nested nets run
on the enclosing blob environment (registry `scoped`), and every blob they write is bound back. A condition
known when the net is traced (a constant, or a net run eagerly) picks the branch, or unrolls the loop, in
Python: then the branches may differ in shapes and gradients flow through a loop as through straight code.
A traced condition becomes `lax.cond` (both branches then leave each blob one shape and dtype) and
`lax.while_loop` (whose trip count is data-dependent, so it has no reverse-mode gradient).

`Do` runs its `net` in a workspace of its own, which sees only the blobs bound by `inner_blobs` and
`outer_blobs_idx` (indices into the op's inputs then outputs, the workspace blob left out). That workspace
is pushed on the stack held by the op's last input/output, the blob `CreateScope` makes (`ScopeStack`): its
frames keep the forward pass's local blobs, which a gradient `Do` (is_gradient_op, as Caffe2's
control_ops_grad writes it) pops and reads (saved_fwd_blobs). `HasScope` says whether any frame is left.

Caffe2's gradients of If, Do and While are Python makers (caffe2/python/control_ops_grad.py), which the
Caffe2 API's core registers as Caffe2's core.py does; the records here have no builder maker of their own.
A gradient While pops one forward frame per step: it runs where the forward While's trip count was known
(unrolled, each step's frame kept); a forward `lax.while_loop` carries no frames, so its gradient Do finds none.
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import BadArgumentError, MissingBlobError, ShapeError
from ..ir.netdef import Net, Op
from .facets import NO_EMITTER, NO_ROLES, NO_SHAPE_RULE, Absent
from .gradient_makers import should_not_do_gradient
from .registry import LowerNet, NetFunction, declare_family, facet, register

declare_family(
    __name__,
    roles=NO_ROLES,
    shape_rule=NO_SHAPE_RULE,
    gradient=Absent("Caffe2's maker is Python (control_ops_grad), which the Caffe2 API's core registers"),
    emitter=NO_EMITTER,
)


# ------------------------------------------------------------------------------------------------
# The workspace stack


@jax.tree_util.register_pytree_node_class
class ScopeStack:
    """Caffe2's `detail::WorkspaceStack` as a value: the local blobs of each workspace a forward `Do` pushed
    (`frames`, innermost last) and how many are live (`depth`, an int32 scalar). Under a traced condition a
    branch that pushed no frame carries a zero frame of the other's structure, so `depth` may be traced and
    smaller than `len(frames)`; a gradient `Do` pops the last frame, which its own branch of the
    condition pushed."""

    def __init__(self, frames: tuple[dict[str, Any], ...], depth: Any):
        self.frames = tuple(frames)
        self.depth = depth

    def tree_flatten(self) -> tuple[tuple[Any, ...], None]:
        return (self.frames, self.depth), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Any, ...]) -> ScopeStack:
        frames, depth = children
        return cls(tuple(frames), depth)

    def __repr__(self) -> str:
        return f"ScopeStack({len(self.frames)} frames, depth {self.depth})"


def _empty_stack() -> ScopeStack:
    return ScopeStack((), np.zeros((), np.int32))


def _stack_of(op: Op, name: str, value: Any) -> ScopeStack:
    if not isinstance(value, ScopeStack):
        raise ShapeError(f"{op.where}: blob '{name}' is no workspace stack (the output of a CreateScope op)")
    return value


# ------------------------------------------------------------------------------------------------
# What nested nets read and write


def _shares_workspace(op: Op) -> Iterable[Net]:
    """The nets `op` runs in its own workspace (If's and While's): what they write, it writes."""
    if op.type in ("If", "While"):
        for _, net in op.nested_nets():
            yield net


def written_by(net: Net) -> list[str]:
    """Every blob `net` leaves written in its workspace, in order: its ops' outputs, and what the nets of
    its If and While ops write (a Do's net writes in a workspace of its own)."""
    names: dict[str, None] = {}
    for op in net.ops:
        for inner in _shares_workspace(op):
            names.update(dict.fromkeys(written_by(inner)))
        names.update(dict.fromkeys(op.outputs))
    return list(names)


def _is_traced(value: Any) -> bool:
    return isinstance(value, jax.core.Tracer)


def _condition(op: Op, value: Any, what: str) -> Any:
    """The single value of a condition tensor, as a bool scalar (traced or not)."""
    size = getattr(value, "size", None)
    if size is None or getattr(value, "dtype", None) is None:
        raise ShapeError(f"{op.where}: Invalid condition in {what} operator: tensor expected")
    if size != 1:
        raise ShapeError(
            f"{op.where}: Invalid condition tensor in {what} operator: single value expected "
            f"(blob '{op.inputs[0]}' has shape {list(value.shape)})"
        )
    flat = jnp.reshape(value, ()) if _is_traced(value) else np.reshape(np.asarray(value), ())
    return flat.astype(bool)


def _shapes(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def _zeros_like(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), tree)


def _align_stack(value: ScopeStack, other: Any) -> ScopeStack:
    """A workspace stack one branch of a `lax.cond` left, in the structure both branches' stacks fit
    (`other` is the other branch's, as shapes): each frame index gets the union of the branches' blobs,
    zeros where this branch has none. The branch that pushed no frame keeps its depth, so its zero frame is
    never popped (a gradient Do pops a frame only in the branch that pushed it)."""
    count = max(len(value.frames), len(other.frames))
    layout: list[dict[str, Any]] = [{} for _ in range(count)]
    for stack in (value, other):
        for i, frame in enumerate(stack.frames):
            for name, blob in frame.items():
                layout[i].setdefault(name, _shapes(blob))
    frames = []
    for i, names in enumerate(layout):
        own = value.frames[i] if i < len(value.frames) else {}
        frames.append({n: own[n] if n in own else _zeros_like(s) for n, s in sorted(names.items())})
    return ScopeStack(tuple(frames), jnp.asarray(value.depth, jnp.int32))


# ------------------------------------------------------------------------------------------------
# If


class IfLowering:
    """If: then_net when the condition (input 0, one value) holds, else else_net (when given)."""

    def __init__(self, op: Op, lower: LowerNet):
        self.op = op
        if "then_net" not in dict(op.nested_nets()):
            raise BadArgumentError(f"{op.where}: then_net must be specified in If operator")
        self.branches: dict[bool, NetFunction | None] = {True: lower(op.net("then_net")), False: None}
        self.writes = {True: written_by(op.net("then_net")), False: []}
        if op.has("else_net"):
            self.branches[False] = lower(op.net("else_net"))
            self.writes[False] = written_by(op.net("else_net"))
        reads = [*self.branches[True].inputs, *(self.branches[False].inputs if self.branches[False] else ())]
        self.scope_reads = tuple(dict.fromkeys(reads))
        self.scope_writes = tuple(dict.fromkeys([*self.writes[True], *self.writes[False]]))
        self.optional_reads = tuple(dict.fromkeys([*self.scope_writes, *op.outputs]))
        self.static_scope_reads = tuple(
            dict.fromkeys(n for net in self.branches.values() if net is not None for n in net.static_inputs())
        )

    def _run(self, taken: bool, scope: Mapping[str, Any], key: jax.Array) -> dict[str, Any]:
        net = self.branches[taken]
        local: ChainMap = ChainMap({}, scope)
        if net is not None:
            net.run(local, key=key)
        return local.maps[0]

    binds_outputs = True  # the nets' writes are bound in `scope`; an output they skip stays unset, as in Caffe2

    def __call__(self, condition: Any, *_: Any, scope: MutableMapping[str, Any], key: jax.Array) -> None:
        op = self.op
        flag = _condition(op, condition, "If")
        if not _is_traced(flag):
            scope.update(self._run(bool(flag), scope, key))
        else:
            scope.update(self._cond(flag, scope, key))

    def _cond(self, flag: Any, scope: Mapping[str, Any], key: jax.Array) -> dict[str, Any]:
        """Both branches under `lax.cond`, over the blobs either writes that both can leave (a blob only one
        branch writes and the enclosing net lacks exists after the op only when that branch runs: Caffe2
        leaves it unset otherwise, and so does this, for both)."""
        shapes = {taken: jax.eval_shape(lambda t=taken: self._run(t, scope, key)) for taken in (True, False)}
        names = [n for n in self.scope_writes if all(n in shapes[t] or n in scope for t in (True, False))]

        def branch(taken: bool) -> Callable[[], list[Any]]:
            def run() -> list[Any]:
                written = self._run(taken, scope, key)
                values = [written[n] if n in written else scope[n] for n in names]
                others = {n: shapes[not taken][n] if n in shapes[not taken] else scope[n] for n in names}
                return [_match(v, others[n]) for n, v in zip(names, values, strict=True)]

            return run

        try:
            results = jax.lax.cond(flag, branch(True), branch(False))
        except TypeError as error:
            raise ShapeError(
                f"{self.op.where}: the condition is known only at run time, so both branches must leave each "
                f"blob they write with one shape and dtype (lax.cond): {str(error).splitlines()[0]}"
            ) from None
        return dict(zip(names, results, strict=True))


def _match(value: Any, other: Any) -> Any:
    """`value` made the structure `other` has, where both are workspace stacks (a frame one branch pushed)."""
    if isinstance(value, ScopeStack) and isinstance(other, ScopeStack):
        return _align_stack(value, other)
    return value


@register("If", inputs=(1, None), outputs=(0, None), random=True, scoped=True, carries_nets=True)
def if_op(op: Op, lower: LowerNet) -> IfLowering:
    return IfLowering(op, lower)


# ------------------------------------------------------------------------------------------------
# While


class WhileLowering:
    """While: run cond_net (when given), stop when the condition blob (input 0) is false, run loop_net,
    again. The condition is read from its blob each time, as Caffe2 reads the op's input tensor."""

    def __init__(self, op: Op, lower: LowerNet):
        self.op = op
        if "loop_net" not in dict(op.nested_nets()):
            raise BadArgumentError(f"{op.where}: loop_net must be specified in While operator")
        self.body = lower(op.net("loop_net"))
        self.cond = lower(op.net("cond_net")) if op.has("cond_net") else None
        cond_writes = written_by(op.net("cond_net")) if self.cond is not None else []
        reads = [*(self.cond.inputs if self.cond else ()), *(n for n in self.body.inputs if n not in cond_writes)]
        self.scope_reads = tuple(dict.fromkeys(reads))
        self.scope_writes = tuple(dict.fromkeys([*cond_writes, *written_by(op.net("loop_net"))]))
        self.optional_reads = tuple(dict.fromkeys([*self.scope_writes, *op.outputs]))
        nets = [self.body, *([self.cond] if self.cond else [])]
        self.static_scope_reads = tuple(dict.fromkeys(n for net in nets for n in net.static_inputs()))

    def _step(self, net: NetFunction | None, state: dict[str, Any], scope: Mapping[str, Any], key: jax.Array) -> None:
        if net is not None:
            local: ChainMap = ChainMap({}, state, scope)
            net.run(local, key=key)
            state.update(local.maps[0])

    binds_outputs = True  # the nets' writes are bound in `scope`; an output they skip stays unset, as in Caffe2

    def __call__(self, condition: Any, *_: Any, scope: MutableMapping[str, Any], key: jax.Array) -> None:
        op = self.op
        _condition(op, condition, "While")
        name = op.inputs[0]
        state: dict[str, Any] = {}
        self._step(self.cond, state, scope, key)
        iteration = 0
        while True:
            flag = _condition(op, state.get(name, scope.get(name)), "While")
            if _is_traced(flag):
                state = self._loop(state, scope, key, iteration)
                break
            if not bool(flag):
                break
            # a known condition: the loop unrolls (each step traced once), and reverse-mode gradients flow
            key_i = jax.random.fold_in(key, iteration)
            self._step(self.body, state, scope, key_i)
            self._step(self.cond, state, scope, key_i)
            iteration += 1
        scope.update(state)

    def _loop(self, state: dict[str, Any], scope: Mapping[str, Any], key: jax.Array, start: int) -> dict[str, Any]:
        """`lax.while_loop` from `state`, carrying every blob the nets write. A blob the loop writes that the
        enclosing net lacks starts as zeros of the shape one step gives it (the loop writes it before it reads
        it, or Caffe2 would refuse). Workspace stacks carry their depth alone: the frames each step's Do
        pushes are dropped (a While's gradient, which reads them, needs a known trip count)."""
        op, name = self.op, self.op.inputs[0]
        initial = {n: state[n] if n in state else scope[n] for n in self.scope_writes if n in state or n in scope}
        initial.setdefault(name, state.get(name, scope.get(name)))

        def one_step(carry: dict[str, Any], counter: Any) -> dict[str, Any]:
            values = dict(carry)
            key_i = jax.random.fold_in(key, counter)
            self._step(self.body, values, scope, key_i)
            self._step(self.cond, values, scope, key_i)
            return {n: _keep_frames(values[n], carry.get(n)) for n in values if n in self.scope_writes or n == name}

        shapes = jax.eval_shape(lambda: one_step(initial, jnp.int32(start)))
        for n, shape in shapes.items():
            if n not in initial:
                initial[n] = _zeros_like(shape)
        before = jax.eval_shape(lambda: initial)
        for n in initial:
            if n in shapes and not _same_layout(before[n], shapes[n]):
                raise ShapeError(
                    f"{op.where}: the loop's condition is known only at run time (lax.while_loop), so each blob it "
                    f"carries must keep one shape and dtype; blob '{n}' is {_describe(before[n])} before a step and "
                    f"{_describe(shapes[n])} after it"
                )
        initial = {n: _as_carry(v) for n, v in initial.items()}

        def cond_fun(carry: tuple[dict[str, Any], Any]) -> Any:
            return _condition(op, carry[0][name], "While")

        def body_fun(carry: tuple[dict[str, Any], Any]) -> tuple[dict[str, Any], Any]:
            values, counter = carry
            stepped = one_step(values, counter)
            return {n: _as_carry(stepped.get(n, values[n])) for n in values}, counter + 1

        final, _ = jax.lax.while_loop(cond_fun, body_fun, (initial, jnp.int32(start)))
        return final


def _same_layout(a: Any, b: Any) -> bool:
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
        (x.shape, x.dtype) == (y.shape, y.dtype) for x, y in zip(leaves_a, leaves_b, strict=True)
    )


def _as_carry(value: Any) -> Any:
    if isinstance(value, ScopeStack):
        return ScopeStack(value.frames, jnp.asarray(value.depth, jnp.int32))
    return jnp.asarray(value)


def _keep_frames(value: Any, before: Any) -> Any:
    """A workspace stack after a step, with the frames the stack had before it (its depth as it is now)."""
    if isinstance(value, ScopeStack) and isinstance(before, ScopeStack):
        return ScopeStack(before.frames, value.depth)
    return value


def _describe(tree: Any) -> str:
    leaves = jax.tree_util.tree_leaves(tree)
    if len(leaves) == 1 and not isinstance(tree, ScopeStack):
        return f"{leaves[0].dtype}[{','.join(str(d) for d in leaves[0].shape)}]"
    return repr(tree)


@register("While", inputs=(1, None), outputs=(0, None), random=True, scoped=True, carries_nets=True)
def while_op(op: Op, lower: LowerNet) -> WhileLowering:
    return WhileLowering(op, lower)


# ------------------------------------------------------------------------------------------------
# Do


class DoLowering:
    """Do: its net in a workspace of its own, seeing the outer blobs bound to inner names only."""

    def __init__(self, op: Op, lower: LowerNet):
        self.op = op
        if "net" not in dict(op.nested_nets()):
            raise BadArgumentError(f"{op.where}: net must be specified in Do operator")
        self.net = lower(op.net("net"))
        self.gradient = op.is_gradient_op
        self.reuse = op.bool("reuse_workspace", False)
        if self.gradient and self.reuse:
            raise BadArgumentError(f"{op.where}: Gradient Do op requires use of stacked workspaces")
        self.bindings = self._bindings(op)  # inner name -> outer name
        self.saved = op.strings("saved_fwd_blobs", ())
        self.scope_reads = ()
        outer_inputs = set(op.inputs[:-1])
        self.scope_writes = tuple(
            outer for inner, outer in self.bindings.items() if outer in outer_inputs and outer not in op.outputs
        )
        self.optional_reads = op.outputs[:-1]  # an output its net does not write stays as it was

    binds_outputs = True  # an output bound to a blob its net leaves unwritten stays unset, as in Caffe2

    @staticmethod
    def _bindings(op: Op) -> dict[str, str]:
        """Caffe2's checkAndGetOuterNames and the binding checks of DoOp's constructor."""
        if not op.inputs:
            raise BadArgumentError(f"{op.where}: Expected at least one input blob")
        if not op.outputs:
            raise BadArgumentError(f"{op.where}: Expected at least one output blob")
        inputs, outputs = op.inputs[:-1], op.outputs[:-1]
        if len(set(inputs)) != len(inputs):
            raise BadArgumentError(f"{op.where}: Duplicate input blobs")
        if op.inputs[-1] != op.outputs[-1]:
            raise BadArgumentError(
                f"{op.where}: Expected same input/output workspace blob ('{op.inputs[-1]}' and '{op.outputs[-1]}')"
            )
        if len(set(outputs)) != len(outputs):
            raise BadArgumentError(f"{op.where}: Duplicate output blobs")
        outer_names = [*inputs, *outputs]
        inner = op.strings("inner_blobs", ())
        indices = op.ints("outer_blobs_idx", ())
        if len(inner) != len(indices):
            raise BadArgumentError(f"{op.where}: Invalid blob bindings: different inner/outer blobs lengths")
        bindings: dict[str, str] = {}
        used: set[str] = set()
        for name, index in zip(inner, indices, strict=True):
            if name in bindings:
                raise BadArgumentError(f"{op.where}: Invalid blob bindings: redefinition of inner blob {name}")
            if not 0 <= index < len(outer_names):
                raise BadArgumentError(
                    f"{op.where}: Invalid blob bindings: outer blob index ({index}, inner name: {name}) is out of "
                    f"bounds [0, {len(outer_names) - 1}]"
                )
            outer = outer_names[index]
            if outer in used:
                raise BadArgumentError(f"{op.where}: Reusage of outer name: {outer}")
            used.add(outer)
            bindings[name] = outer
        if used != set(outer_names):
            raise BadArgumentError(f"{op.where}: Not all outer names are used in blob bindings")
        return bindings

    def __call__(self, *inputs: Any, scope: MutableMapping[str, Any], key: jax.Array) -> None:
        op = self.op
        stack = _stack_of(op, op.inputs[-1], inputs[-1])
        outer = dict(zip(op.inputs[:-1], inputs[:-1], strict=True))
        env: dict[str, Any] = {}
        if self.gradient:  # popGradientWorkspace: the forward pass's workspace, the bindings over it
            if not stack.frames:
                raise BadArgumentError(
                    f"{op.where}: Failed to initialize Do op workspace: '{op.inputs[-1]}' holds no forward workspace "
                    "(a forward Do inside a While whose condition is known only at run time keeps none: that loop "
                    "is a lax.while_loop)"
                )
            env.update(stack.frames[-1])
            stack = ScopeStack(stack.frames[:-1], stack.depth - 1)
        elif self.reuse and stack.frames:  # reuseLastForwardWorkspace
            env.update(stack.frames[-1])
            stack = ScopeStack(stack.frames[:-1], stack.depth - 1)
        for inner, name in self.bindings.items():
            if name in outer:
                env[inner] = outer[name]
            elif name in scope:  # an output bound in: Caffe2 forwards the outer blob, as it is
                env[inner] = scope[name]
            else:
                env.pop(inner, None)
        self.net.run(env, key=key)
        bound = set(self.bindings)
        if not self.gradient:
            local = {n: v for n, v in env.items() if n not in bound}
            stack = ScopeStack((*stack.frames, local), stack.depth + 1)
        written = {self.bindings[n]: v for n, v in env.items() if n in bound}
        scope.update(written)
        scope[op.outputs[-1]] = stack


@register("Do", inputs=(1, None), outputs=(1, None), random=True, scoped=True, carries_nets=True)
def do_op(op: Op, lower: LowerNet) -> DoLowering:
    return DoLowering(op, lower)


# ------------------------------------------------------------------------------------------------
# ONNXWhile


_CONDITION_TYPES = (np.dtype(np.int32), np.dtype(np.bool_), np.dtype(np.int64))


class ONNXWhileLowering:
    """ONNXWhile (ONNX's Loop): inputs max trip count, first condition, N loop-carried dependencies; the body
    net's external inputs are the iteration number, the condition and the N dependencies, its external
    outputs the condition, the N dependencies and K scan outputs; the op's outputs the final dependencies
    and the scan outputs stacked over iterations. The body runs in a workspace of its own, which sees none
    of the enclosing blobs (disable_scopes: in the enclosing one, which then keeps what it writes).

    The trip count is made static (registry `static_inputs`): without has_cond the loop is one `lax.scan`,
    so gradients flow; with has_cond it unrolls while the condition is known and becomes `lax.while_loop`
    where it is traced (then it can have no scan outputs: their length would be data-dependent, so a workspace
    runs such an op eagerly, registry `eager`).
    Caffe2 (torch 1.10.2) does not stack the scan outputs as ONNX's Loop does: its first CopyFrom drops the
    iteration axis, and each later iteration extends the first axis by one row and copies one whole step's
    values after the previous ones. The outputs here are Caffe2's (`_caffe2_scan_output`): steps of one row are
    concatenated on the first axis; where Caffe2 would write past the tensor it extends, the op is refused."""

    def __init__(self, op: Op, lower: LowerNet):
        self.op = op
        if "body" not in dict(op.nested_nets()):
            raise BadArgumentError(f"{op.where}: body net must be specified in ONNXWhile operator")
        self.has_trip_count = bool(op.int("has_trip_count", 0))
        self.has_cond = bool(op.int("has_cond", 0))
        self.disable_scopes = bool(op.int("disable_scopes", 0))
        if self.disable_scopes and op.int("save_scopes", 0):
            raise BadArgumentError(f"{op.where}: Cannot save scopes when disable_scopes=True")
        body = op.net("body")
        self.deps = _loop_carried_deps(op)
        if self.deps < 0 or len(op.inputs) < 2 + self.deps:
            raise BadArgumentError(
                f"{op.where}: ONNXWhile takes a trip count, a condition and {self.deps} dependencies"
            )
        if len(body.external_inputs) < 2 + self.deps or not body.external_outputs:
            raise BadArgumentError(
                f"{op.where}: the body net's external inputs must be the iteration number, the condition and the "
                f"{self.deps} loop-carried dependencies, and its first external output the condition"
            )
        self.scans = len(body.external_outputs) - 1 - self.deps
        if self.scans < 0:
            raise BadArgumentError(
                f"{op.where}: Body graph must have N+K outputs, where N is the number of loop-carried dependencies "
                "and K is the number of scan outputs"
            )
        if len(op.outputs) < self.deps + self.scans:
            raise BadArgumentError(
                f"{op.where}: ONNXWhile writes {self.deps} dependencies and {self.scans} scan outputs, but names "
                f"{len(op.outputs)} outputs"
            )
        if not self.has_trip_count and not self.has_cond:
            raise BadArgumentError(f"{op.where}: neither has_trip_count nor has_cond: the loop would never stop")
        self.body = lower(body)
        self.inner = body.external_inputs
        self.results = body.external_outputs
        own = set(self.inner[: 2 + self.deps])
        self.scope_reads = tuple(n for n in self.body.inputs if n not in own) if self.disable_scopes else ()
        self.scope_writes = tuple(dict.fromkeys([*own, *written_by(body)])) if self.disable_scopes else ()

    def _step(self, values: dict[str, Any], scope: Mapping[str, Any], key: jax.Array) -> dict[str, Any]:
        env: MutableMapping[str, Any] = ChainMap(dict(values), scope) if self.disable_scopes else dict(values)
        self.body.run(env, key=key)
        return dict(env.maps[0]) if isinstance(env, ChainMap) else dict(env)

    def _inputs(self, iteration: Any, condition: Any, deps: list[Any], dtype: np.dtype) -> dict[str, Any]:
        xp = jnp if _is_traced(iteration) or _is_traced(condition) else np
        values = {
            self.inner[0]: xp.asarray(iteration, np.int64).reshape(()),
            self.inner[1]: xp.asarray(condition).astype(dtype).reshape((1,)),
        }
        values.update(zip(self.inner[2 : 2 + self.deps], deps, strict=True))
        return values

    def _outputs(self, env: Mapping[str, Any]) -> tuple[Any, list[Any], list[Any]]:
        op = self.op
        try:
            results = [env[name] for name in self.results]
        except KeyError as missing:
            raise MissingBlobError(f"{op.where}: the body net does not write its external output {missing}") from None
        condition = results[0]
        if getattr(condition, "size", 0) < 1:
            raise ShapeError(f"{op.where}: the body's condition output '{self.results[0]}' is empty")
        flat = (
            jnp.reshape(condition, (-1,))[0] if _is_traced(condition) else np.reshape(np.asarray(condition), (-1,))[0]
        )
        return flat.astype(bool), results[1 : 1 + self.deps], results[1 + self.deps :]

    def __call__(self, trips: Any, first: Any, *deps: Any, scope: MutableMapping[str, Any], key: jax.Array) -> tuple:
        op = self.op
        dtype = np.dtype(first.dtype)
        if dtype not in _CONDITION_TYPES:
            raise ShapeError(
                f"{op.where}: the condition '{op.inputs[1]}' is {dtype}; ONNXWhile takes int32, bool or int64"
            )
        if np.dtype(trips.dtype) != np.int64 or trips.size < 1:
            raise ShapeError(f"{op.where}: the trip count '{op.inputs[0]}' must be an int64 tensor, got {trips.dtype}")
        limit = None
        if self.has_trip_count:
            if _is_traced(trips):
                raise ShapeError(f"{op.where}: the trip count '{op.inputs[0]}' must be known when the net is compiled")
            limit = int(np.reshape(np.asarray(trips), (-1,))[0])
        xp = jnp if _is_traced(first) else np
        initial = xp.reshape(xp.asarray(first), (-1,))[0].astype(bool)  # Caffe2 reads the first value
        condition = initial if self.has_cond else np.bool_(True)
        state, written, scans = list(deps[: self.deps]), {}, [[] for _ in range(self.scans)]
        iteration, fed = 0, initial  # the body's condition input: the first value, then its own last output
        if not self.has_cond:
            state, written, stacked, fed, iteration = self._scan(limit, initial, state, dtype, scope, key)
        else:
            while limit is None or iteration < limit:
                if _is_traced(condition):
                    state, written, fed, iteration = self._while(iteration, limit, condition, state, dtype, scope, key)
                    break
                if not bool(condition):
                    break
                written = self._step(
                    self._inputs(iteration, condition, state, dtype), scope, jax.random.fold_in(key, iteration)
                )
                condition, state, outs = self._outputs(written)
                fed = condition
                for k, value in enumerate(outs):
                    scans[k].append(value)
                iteration += 1
            stacked = [_stack(op, values) for values in scans]
        if self.disable_scopes:
            scope.update(self._left_in_scope(scope, written, iteration, fed, state, dtype))
        names = op.outputs[self.deps : self.deps + self.scans]
        return (*state, *(_caffe2_scan_output(op, name, steps) for name, steps in zip(names, stacked, strict=True)))

    def _left_in_scope(
        self, scope: Mapping[str, Any], written: Mapping[str, Any], iteration: Any, fed: Any, state: list[Any], dtype
    ) -> dict[str, Any]:
        """What disable_scopes leaves in the enclosing workspace, which the body's blobs live in: what the last
        iteration wrote, then the body's inputs as Caffe2 sets them for a next iteration (the iteration count,
        the last condition, the final dependencies), and the condition output, which Caffe2 creates before the
        first iteration (one bool, False here: Caffe2 leaves it unset when no iteration runs)."""
        left = {n: written[n] for n in self.scope_writes if n in written}
        left.update(self._inputs(iteration, fed, state, dtype))
        if self.results[0] not in left and self.results[0] not in scope:
            left[self.results[0]] = np.zeros((1,), np.bool_)
        return left

    def _scan(self, limit, initial, state, dtype, scope, key) -> tuple[list[Any], dict[str, Any], list[Any], Any, int]:
        """No has_cond: `limit` steps of one `lax.scan` (the dependencies keep their shapes and dtypes; the body's
        condition input is `initial`, then its own last output, as in Caffe2)."""
        op = self.op
        if not limit:
            return state, {}, [np.zeros((0,), np.int32) for _ in range(self.scans)], initial, 0

        def step(carry: tuple[list[Any], Any, dict[str, Any]], iteration: Any) -> tuple:
            deps, fed, _ = carry
            env = self._step(self._inputs(iteration, fed, deps, dtype), scope, jax.random.fold_in(key, iteration))
            flag, new, outs = self._outputs(env)
            kept = {n: env[n] for n in self.scope_writes if n in env}
            return (
                [_like(op, self.results[1 + j], v, d) for j, (v, d) in enumerate(zip(new, deps, strict=True))],
                jnp.asarray(flag, bool),
                kept,
            ), outs

        deps0, fed0 = [jnp.asarray(d) for d in state], jnp.asarray(initial, bool)
        first = jax.eval_shape(lambda: step((deps0, fed0, {}), jnp.int64(0)))
        kept0 = _zeros_like(first[0][2])
        (final, fed, kept), stacked = jax.lax.scan(step, (deps0, fed0, kept0), jnp.arange(limit, dtype=np.int64))
        return list(final), kept, list(stacked), fed, limit

    def _while(self, start, limit, condition, state, dtype, scope, key) -> tuple[list[Any], dict[str, Any], Any, Any]:
        """A traced condition: `lax.while_loop` on, from iteration `start` (bounded by the trip count); the final
        dependencies, the last iteration's blobs, the last condition and the iteration count."""
        op = self.op
        if self.scans:
            raise ShapeError(
                f"{op.where}: the loop's condition is known only at run time, so its {self.scans} scan output(s) "
                "would have a data-dependent length here; a Workspace (or the Caffe2 API) runs this op eagerly"
            )

        def step(carry):
            iteration, flag, deps, _ = carry
            env = self._step(self._inputs(iteration, flag, deps, dtype), scope, jax.random.fold_in(key, iteration))
            flag, new, _ = self._outputs(env)
            kept = {n: env[n] for n in self.scope_writes if n in env}
            deps = [_like(op, self.results[1 + j], v, d) for j, (v, d) in enumerate(zip(new, deps, strict=True))]
            return iteration + 1, jnp.asarray(flag, bool), deps, kept

        deps0 = [jnp.asarray(d) for d in state]
        first = jax.eval_shape(lambda: step((jnp.int64(start), jnp.asarray(condition, bool), deps0, {})))
        carry = (jnp.int64(start), jnp.asarray(condition, bool), deps0, _zeros_like(first[3]))

        def go_on(carry) -> Any:
            iteration, flag = carry[0], carry[1]
            return flag if limit is None else jnp.logical_and(flag, iteration < limit)

        iterations, flag, final, kept = jax.lax.while_loop(go_on, step, carry)
        return list(final), kept, flag, iterations


def _like(op: Op, name: str, value: Any, before: Any) -> Any:
    """A loop-carried dependency after a step, which a compiled loop carries with the shape and dtype it had."""
    if tuple(value.shape) != tuple(before.shape) or np.dtype(value.dtype) != np.dtype(before.dtype):
        raise ShapeError(
            f"{op.where}: loop-carried dependency '{name}' is {np.dtype(before.dtype)}{list(before.shape)} before a "
            f"step and {np.dtype(value.dtype)}{list(value.shape)} after it; a compiled loop keeps one shape and dtype"
        )
    return value


def _caffe2_scan_output(op: Op, name: str, steps: Any) -> Any:
    """What Caffe2's ONNXWhile leaves in scan output `name` from the per-iteration values `steps` ([n, *dims]):
    the first value as it is, then each iteration's values copied after the previous ones while the tensor
    grows by one row (Tensor::Extend). With one row per step that is the steps concatenated on the first axis;
    with more, the first two iterations fill dims[0] + 1 rows and a third writes past the tensor's memory."""
    n, dims = steps.shape[0], tuple(steps.shape[1:])
    if n <= 1:
        return steps if n == 0 else jnp.reshape(steps, dims)
    if not dims:
        raise ShapeError(
            f"{op.where}: scan output '{name}' is a scalar per iteration, which Caffe2's ONNXWhile cannot extend "
            "past the first iteration (Tensor::Extend needs at least one dimension)"
        )
    if dims[0] == 1:
        return jnp.reshape(steps, (n, *dims[1:]))
    if n > 2:
        raise ShapeError(
            f"{op.where}: scan output '{name}' has {dims[0]} rows per iteration; over {n} iterations Caffe2's "
            "ONNXWhile copies each iteration's rows past the one row it extends the tensor by, writing past its "
            "memory (one row per iteration, or at most 2 iterations, is defined)"
        )
    rest = math.prod(dims[1:])
    flat = jnp.reshape(steps, (-1,))[: (dims[0] + 1) * rest]
    return jnp.reshape(flat, (dims[0] + 1, *dims[1:]))


def _stack(op: Op, values: list[Any]) -> Any:
    if not values:
        return np.zeros((0,), np.int32)  # Caffe2's zero-iteration scan output
    if len({(tuple(v.shape), np.dtype(v.dtype)) for v in values}) > 1:
        raise ShapeError(f"{op.where}: Size of scan output changed across iterations")
    return jnp.stack([jnp.asarray(v) for v in values])


def _scans_of_a_condition(op: Op) -> bool:
    """An ONNXWhile whose condition decides the trip count and that has scan outputs: their length depends on
    values, so a workspace runs it eagerly (registry `eager`), where the loop unrolls on known conditions."""
    body = dict(op.nested_nets()).get("body")
    if body is None or not op.int("has_cond", 0):
        return False
    return len(body.external_outputs) - 1 - _loop_carried_deps(op) > 0


def _loop_carried_deps(op: Op) -> int:
    """ONNXWhile's N: `num_loop_carried_deps`, else every input after the trip count and the condition."""
    count = op.int("num_loop_carried_deps", -1)
    return len(op.inputs) - 2 if count == -1 else count


@register(
    "ONNXWhile",
    inputs=(2, None),
    outputs=(0, None),
    random=True,
    scoped=True,
    carries_nets=True,
    static_inputs=(0,),
    eager=_scans_of_a_condition,
)
def onnx_while(op: Op, lower: LowerNet) -> ONNXWhileLowering:
    return ONNXWhileLowering(op, lower)


# ------------------------------------------------------------------------------------------------
# CreateScope, HasScope


@register("CreateScope", inputs=0, outputs=1)
def create_scope(op: Op) -> Callable[[], ScopeStack]:
    """An empty workspace stack (Caffe2 clears the stack the blob holds)."""
    return _empty_stack


@register("HasScope", inputs=1, outputs=1)
def has_scope(op: Op) -> Callable[[Any], Any]:
    def kernel(stack: Any) -> Any:
        depth = _stack_of(op, op.inputs[0], stack).depth
        if not _is_traced(depth):  # known: a While over it (a gradient While's) unrolls
            return np.reshape(np.asarray(depth) > 0, (1,))
        return jnp.reshape(depth > 0, (1,))

    return kernel


facet("gradient", "CreateScope", "HasScope")(should_not_do_gradient)
