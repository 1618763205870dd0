"""Human-readable summaries of nets and plans, for `rnn2jax inspect`."""

from __future__ import annotations

from collections import Counter

from ..ir.netdef import Net, Op, Plan
from ..ops.registry import kind, unsupported_ops

RECURRENT_OPS = ("RecurrentNetwork", "RecurrentNetworkGradient")


def _names(names: tuple[str, ...], limit: int = 12) -> str:
    if not names:
        return "(none)"
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _step_net_line(label: str, net: Net) -> str:
    types = ", ".join(op.type for op in net.ops[:8]) + (", ..." if len(net.ops) > 8 else "")
    return f"      {label} '{net.name}': {len(net.ops)} ops ({types})"


def _recurrent_lines(op: Op) -> list[str]:
    arg = op.args.get("recurrent_states")
    states = arg.value if arg is not None and arg.kind == "strings" else ()
    lines = [f"    op #{op.index} {op.type}: {len(op.inputs)} inputs, {len(op.outputs)} outputs"]
    if states:
        lines.append(f"      recurrent states: {', '.join(map(str, states))}")
    for label, inner in op.nested_nets():
        lines.append(_step_net_line(label, inner))
    return lines


def describe_net(net: Net, indent: str = "") -> str:
    nested = sum(1 for _ in net.walk())
    lines = [
        f"net '{net.name}': {len(net.ops)} ops"
        + (f" ({nested} with step nets)" if nested > len(net.ops) else "")
    ]
    lines.append(f"  external inputs ({len(net.external_inputs)}): {_names(net.external_inputs)}")
    lines.append(f"  external outputs ({len(net.external_outputs)}): {_names(net.external_outputs)}")
    lines.append("  op types:")
    for op_type, count in sorted(Counter(op.type for op in net.ops).items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"    {count:4d}  {op_type}")
    recurrent = [op for op in net.ops if op.type in RECURRENT_OPS]
    lines.append(f"  recurrent ops ({len(recurrent)}):" if recurrent else "  recurrent ops: none")
    for op in recurrent:
        lines.extend(_recurrent_lines(op))
    user = Counter(op.type for op in net.walk() if kind(op.type) == "user")
    if user:
        lines.append("  user ops: " + ", ".join(f"{t} x{n}" for t, n in sorted(user.items())))
    host = Counter(op.type for op in net.ops if kind(op.type) == "host")  # run between jitted segments
    if host:
        lines.append("  host ops: " + ", ".join(f"{t} x{n}" for t, n in sorted(host.items())))
    missing = unsupported_ops([net], host_ops=True)
    if missing:
        by_type = Counter(t for _, t in missing)
        lines.append(f"  unsupported: {len(missing)} ops of {len(by_type)} types")
        for op_type, count in sorted(by_type.items()):
            places = [w for w, t in missing if t == op_type]
            lines.append(
                f"    {op_type} x{count}: {places[0]}" + (f" (+{count - 1} more)" if count > 1 else "")
            )
    else:
        lines.append("  unsupported: none")
    return "\n".join(indent + line for line in lines)


def describe(loaded: Net | Plan, title: str = "") -> str:
    """A summary of a net, or of every net of a plan."""
    head = [f"== {title}"] if title else []
    if isinstance(loaded, Plan):
        head.append(f"plan '{loaded.name}': {len(loaded.nets)} nets ({', '.join(loaded.nets)})")
        return "\n".join(head + [describe_net(net) for net in loaded.nets.values()])
    return "\n".join([*head, describe_net(loaded)])
