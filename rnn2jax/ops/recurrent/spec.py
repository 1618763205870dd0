"""A RecurrentNetwork op's arguments (links, aliases, recurrent states, step nets), decoded and checked once.

Shared by the forward scan (forward.py), the gradient scan (gradient.py) and `rnn2jax.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ...errors import BadArgumentError, ShapeError
from ...ir.netdef import Net, Op
from ..emit import codegen_helper


@dataclass(frozen=True)
class Link:
    internal: str
    external: str
    offset: int
    window: int


@dataclass(frozen=True)
class Alias:
    src: str
    dst: str
    offset: int


@dataclass(frozen=True)
class RecurrentSpec:
    """A RecurrentNetwork op's arguments, decoded and checked once."""

    op: Op
    step_net: Net
    timestep: str
    states: tuple[str, ...]
    initial_ids: tuple[int, ...]
    links: tuple[Link, ...]
    aliases: tuple[Alias, ...]
    backward_step_net: Net | None
    recompute: tuple[str, ...]

    @property
    def forward_only(self) -> bool:
        return self.backward_step_net is None


def _equal_lengths(op: Op, names: tuple[str, ...], *values: tuple) -> None:
    lengths = {len(v) for v in values}
    if len(lengths) > 1:
        listed = ", ".join(f"{n} ({len(v)})" for n, v in zip(names, values, strict=True))
        raise BadArgumentError(f"{op.where}: arguments {listed} must have equal lengths")


INT32_MAX = 2**31 - 1


def int32s(op: Op, name: str) -> tuple[int, ...]:
    """A list argument Caffe2 reads as `int` (32 bits): it refused values that do not fit
    ("Value ... of argument ... cannot be represented correctly in a target type")."""
    values = op.ints(name, ())
    wrong = [v for v in values if not -INT32_MAX - 1 <= v <= INT32_MAX]
    if wrong:
        raise BadArgumentError(f"{op.where}: argument '{name}' holds {wrong[0]}, which does not fit in 32 bits")
    return values


def remapped_name(op: Op, name: str) -> str:
    """Caffe2's `remappedName`: memonger may rename blobs with `<name>.rename` arguments."""
    arg = op.args.get(f"{name}.rename")
    return op.str(f"{name}.rename") if arg is not None and arg.kind == "s" else name


def decode_links(op: Op, prefix: str = "") -> tuple[Link, ...]:
    """The links named by `{prefix}link_*`. Caffe2 reads no window for the gradient op's backward
    links (`extractLinks(..., "backward_link_offset", "", ...)`): they are one row, whatever
    `backward_link_window` says."""
    internal = op.strings(f"{prefix}link_internal", ())
    external = op.strings(f"{prefix}link_external", ())
    offset = int32s(op, f"{prefix}link_offset")
    window = (int32s(op, "link_window") if not prefix else ()) or (1,) * len(internal)
    names = tuple(f"{prefix}link_{n}" for n in ("internal", "external", "offset"))
    if prefix:
        _equal_lengths(op, names, internal, external, offset)
    else:
        _equal_lengths(op, (*names, "link_window"), internal, external, offset, window)
    links = tuple(
        Link(remapped_name(op, i), remapped_name(op, e), o, w)
        for i, e, o, w in zip(internal, external, offset, window, strict=True)
    )
    for link in links:
        if link.offset < 0:
            raise BadArgumentError(
                f"{op.where}: argument '{prefix}link_offset' is {link.offset} for link {link.internal} -> "
                f"{link.external}; offsets must be >= 0"
            )
        if link.window < 1:
            raise BadArgumentError(
                f"{op.where}: argument 'link_window' is {link.window} for link {link.internal} -> "
                f"{link.external}; a link views at least one row (Caffe2's view of 0 rows is detached: "
                "what the step writes through it is lost, and the state rows stay uninitialised)"
            )
    return links


def check_link_rows(op: Op, link: Link, rows: int, steps: int, prefix: str = "") -> None:
    """A link views rows [t + offset, t + offset + window) of its tensor at every step t < T: they must
    exist. Caffe2 does not check (past the end it reads and writes outside the tensor, or dies)."""
    last = steps - 1 + link.offset + link.window
    if steps and last > rows:
        window = f" and 'link_window' {link.window}" if not prefix else ""
        raise BadArgumentError(
            f"{op.where}: argument '{prefix}link_offset' {link.offset}{window} of link {link.internal} -> "
            f"{link.external}: step {steps - 1} views rows up to {last} of '{link.external}', which has {rows}"
        )


def check_timestep(op: Op, timestep: str, net: Net, links: tuple[Link, ...], what: str) -> None:
    """The timestep blob is written by the op before each step; Caffe2 refuses a step net that writes it
    ("Timestep cannot be output of an op"), link views included."""
    writers = [o for o in net.ops if timestep in o.outputs]
    if writers or any(link.internal == timestep for link in links):
        by = f"{writers[0].where} writes it" if writers else "a link's internal blob has that name"
        raise BadArgumentError(f"{op.where}: argument 'timestep' is '{timestep}', but in {what} {by}")


def decode_spec(op: Op) -> RecurrentSpec:
    # Caffe2 reads a missing step_net as an empty NetDef, whose steps write nothing (uninitialised
    # state rows); rnn2jax requires the argument (an empty net is accepted, its rows are zeros)
    step_net = op.net("step_net")
    states = op.strings("recurrent_states", ())
    initial_ids = int32s(op, "initial_recurrent_state_ids")
    _equal_lengths(op, ("recurrent_states", "initial_recurrent_state_ids"), states, initial_ids)
    for state, index in zip(states, initial_ids, strict=True):
        if not 0 <= index < len(op.inputs):
            raise BadArgumentError(
                f"{op.where}: argument 'initial_recurrent_state_ids' names input #{index} for state '{state}', "
                f"but the op has {len(op.inputs)} inputs"
            )
    duplicates = sorted({s for s in states if states.count(s) > 1})
    if duplicates:
        raise BadArgumentError(f"{op.where}: argument 'recurrent_states' lists '{duplicates[0]}' more than once")
    src, dst, offsets = op.strings("alias_src", ()), op.strings("alias_dst", ()), int32s(op, "alias_offset")
    _equal_lengths(op, ("alias_src", "alias_dst", "alias_offset"), src, dst, offsets)
    links = decode_links(op)
    timestep = op.str("timestep", "timestep")
    check_timestep(op, timestep, step_net, links, "step_net")
    backward = op.args.get("backward_step_net")
    return RecurrentSpec(
        op=op,
        step_net=step_net,
        timestep=timestep,
        states=states,
        initial_ids=initial_ids,
        links=links,
        aliases=tuple(Alias(s, d, o) for s, d, o in zip(src, dst, offsets, strict=True)),
        backward_step_net=backward.value if backward is not None and backward.kind == "n" else None,
        recompute=op.strings("recompute_blobs_on_backward", ()),
    )


@codegen_helper
def state_rows(value: jax.Array, batch: int) -> jax.Array:
    """A recurrent state's initial value as its first L rows [L, N, D]: [D] is repeated over the batch,
    [N, D] and [1, N, D] are one row, [L, N, D] are L rows."""
    if value.ndim == 1:
        return jnp.broadcast_to(value, (1, batch, value.shape[0]))
    return value[None] if value.ndim == 2 else value


def initial_rows(op: Op, name: str, value: jax.Array, batch: int) -> jax.Array:
    """`state_rows`, once the value is checked to be one of its forms for this batch size."""
    if value.ndim == 1 or (value.ndim in (2, 3) and value.shape[-2] == batch):
        return state_rows(value, batch)
    raise ShapeError(
        f"{op.where}: initial state '{name}' has shape {list(value.shape)}; expected [D], [N, D], [1, N, D] "
        f"or [L, N, D] with N = {batch} (the batch size of input '{op.inputs[0]}')"
    )
