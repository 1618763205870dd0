"""`rnn2jax draw`: a net as a Graphviz picture, in the look of Caffe2's `net_drawer` (ops as green boxes, blobs
as ellipses), with what net_drawer could not show: each RecurrentNetwork is a box holding its step net (and
its backward step net beside it), and its links, aliases and recurrent states are edges between the outer
blobs and the step net's blobs. In a training net the RecurrentNetworkGradient's box holds the backward step
net, which it runs, and the forward op's box the step net: each is drawn once. The layout runs top to
bottom by default (step nets are long chains, so forward and backward stand side by side); net_drawer's
left to right is `rankdir="LR"`.

The DOT text is built here, by hand, so writing `.dot` needs nothing; `.svg`, `.png` and `.pdf` go through
the `graphviz` package (the `draw` extra) and Graphviz's `dot` program.

Node ids (each node's `<title>` in an SVG), so a picture can be searched and checked:
- an op: `op#I`; a blob: its name, `name@K` after the net rewrote it K times (as net_drawer, so the
  graph has no cycles); Graphviz keeps a `\\` in an id written as `\\\\`;
- inside recurrent op #I, the step net's ops and blobs take the prefix `op#I:step_net/` (the backward step
  net's `op#I:backward_step_net/`, nested recurrent ops add theirs), and the op's own blobs (recurrent
  states, their gradients, what lives only in the op's workspace) the prefix `op#I:`.

Edges, labelled: `link offset O[, window W]` between a link's external blob and the step net's internal one
(towards the step net where it reads the blob, away from it where it writes it; `backward link ...` for the
backward step net), `alias offset O` from a recurrent state to the op output that views it, `initial` from
a state's initial value to the state, `timestep` from the op to the step net's timestep blob, and dotted
`shared` edges for op inputs the step net reads by name (parameters). Inputs and outputs drawn no other
way attach to the op's box. A RecurrentNetworkGradient's box has no aliases (its forward outputs are
inputs); edges labelled `param grad` and `initial` go from the backward step net's parameter gradients and
from the state gradients to its outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.netdef import Net, Op
from ..ops.recurrent.spec import Link, RecurrentSpec, decode_links, decode_spec, remapped_name

RECURRENT_OPS = ("RecurrentNetwork", "RecurrentNetworkGradient")

# net_drawer's OP_STYLE; blobs are ellipses (net_drawer used octagons)
OP_STYLE = {"shape": "box", "style": "filled", "color": "#0F9D58", "fontcolor": "#FFFFFF"}
BLOB_STYLE = {"shape": "ellipse"}
STATE_STYLE = {"shape": "ellipse", "style": "filled", "fillcolor": "#FFF2B3"}
WORKSPACE_STYLE = {"shape": "ellipse", "style": "dashed"}
OP_CLUSTER = {"style": "rounded", "color": "#4285F4", "penwidth": "2"}
STEP_CLUSTER = {"style": "filled", "fillcolor": "#EEF6E8", "color": "#0F9D58"}
BACKWARD_CLUSTER = {"style": "filled", "fillcolor": "#FBEAE8", "color": "#DB4437"}


def quote(text: str) -> str:
    """A DOT string: escapes `\\` (which DOT labels read as escapes like `\\n`) and `"`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(attrs: dict[str, str]) -> str:
    return ", ".join(f"{key}={quote(value)}" for key, value in attrs.items())


@dataclass
class _Graph:
    """A graph or cluster: its nodes are declared inside it (which places them), edges go to the root."""

    name: str
    attrs: dict[str, str]
    nodes: list[str] = field(default_factory=list)
    clusters: list[_Graph] = field(default_factory=list)

    def node(self, node_id: str, label: str, style: dict[str, str]) -> None:
        self.nodes.append(f"{quote(node_id)} [{_attrs({'label': label, **style})}]")

    def cluster(self, name: str, label: str, style: dict[str, str]) -> _Graph:
        child = _Graph(f"cluster_{name}", {"label": label, **style})
        self.clusters.append(child)
        return child

    def lines(self, indent: str) -> list[str]:
        out = [f"{indent}{key}={quote(value)};" for key, value in self.attrs.items()]
        out += [f"{indent}{node};" for node in self.nodes]
        for child in self.clusters:
            out.append(f"{indent}subgraph {quote(child.name)} {{")
            out += child.lines(indent + "  ")
            out.append(f"{indent}}}")
        return out


class _Blobs:
    """One net's blob nodes: a new node each time an op writes a blob (net_drawer's versions)."""

    def __init__(self, graph: _Graph, prefix: str):
        self.graph, self.prefix = graph, prefix
        self.version: dict[str, int] = {}
        self.read_first: set[str] = set()  # read before the net writes them: they come from outside

    def _id(self, name: str, version: int) -> str:
        return f"{self.prefix}{name}" + (f"@{version}" if version else "")

    def read(self, name: str) -> str:
        if name not in self.version:
            self.version[name] = 0
            self.read_first.add(name)
            self.graph.node(self._id(name, 0), name, BLOB_STYLE)
        return self._id(name, self.version[name])

    def write(self, name: str) -> str:
        self.version[name] = self.version.get(name, -1) + 1
        self.graph.node(self._id(name, self.version[name]), name, BLOB_STYLE)
        return self._id(name, self.version[name])

    def written(self, name: str) -> bool:
        return self.version.get(name, 0) > 0 or (name in self.version and name not in self.read_first)

    def first(self, name: str) -> str:
        """The blob as the net found it (declared when the net never touched it)."""
        if name not in self.version:
            return self.read(name)
        return self._id(name, 0)


class _Drawer:
    def __init__(self) -> None:
        self.edges: list[str] = []

    def edge(self, tail: str, head: str, **attrs: str) -> None:
        self.edges.append(f"{quote(tail)} -> {quote(head)}" + (f" [{_attrs(attrs)}]" if attrs else ""))

    def net(self, net: Net, graph: _Graph, prefix: str) -> _Blobs:
        blobs = _Blobs(graph, prefix)
        # a training net's gradient op runs the backward step net: it is drawn there, and the step net
        # in the forward op's box (each once), joined by the step_workspaces blob
        forward_workspaces = {op.outputs[-1] for op in net.ops if op.type == RECURRENT_OPS[0] and op.outputs}
        gradient_workspaces = {op.inputs[-1] for op in net.ops if op.type == RECURRENT_OPS[1] and op.inputs}
        for op in net.ops:
            if op.type in RECURRENT_OPS and op.has("step_net"):
                if op.type == RECURRENT_OPS[0]:
                    paired = bool(op.outputs) and op.outputs[-1] in gradient_workspaces
                else:
                    paired = bool(op.inputs) and op.inputs[-1] in forward_workspaces
                self.recurrent(op, graph, prefix, blobs, paired)
                continue
            op_id = f"{prefix}op#{op.index}"
            graph.node(op_id, op_label(op), OP_STYLE)
            for name in op.inputs:
                self.edge(blobs.read(name), op_id)
            for name in dict.fromkeys(op.outputs):
                self.edge(op_id, blobs.write(name))
        return blobs

    def recurrent(self, op: Op, graph: _Graph, prefix: str, outer: _Blobs, paired: bool) -> None:
        """A recurrent op's box. `paired`: the net also holds its other half (the gradient op of a forward
        op, or the reverse), which draws the step net this one leaves out."""
        spec = decode_spec(op)  # the arguments as the compiler reads them; a bad one is named here
        gradient = op.type == RECURRENT_OPS[1]
        here = f"{prefix}op#{op.index}"
        box = graph.cluster(here, op_label(op), OP_CLUSTER)
        box.node(here, op_label(op), OP_STYLE)
        in_ids = {name: outer.read(name) for name in op.inputs}  # Caffe2 reads inputs before writing outputs
        out_ids = {name: outer.write(name) for name in dict.fromkeys(op.outputs)}
        used: set[str] = set()
        local: dict[str, str] = {}

        def local_node(name: str, style: dict[str, str]) -> str:
            if name not in local:
                local[name] = f"{here}:{name}"
                box.node(local[name], name, style)
            return local[name]

        def external(name: str, written: bool) -> str:
            """Where a link's or alias's external blob is: a state (or another blob of the op's
            workspace), or the outer blob the op reads or writes under that name."""
            if name in local:
                return local[name]
            ids = out_ids if written else in_ids
            if name in ids:
                used.add(("out:" if written else "in:") + name)
                return ids[name]
            return local_node(name, WORKSPACE_STYLE)

        def connect(tail: str, head_output: str, label: str) -> None:
            used.add("out:" + head_output)
            self.edge(tail, out_ids[head_output], label=label)

        forward_inputs = op.inputs
        if gradient:  # inputs: the output gradients, the forward op's inputs, its outputs
            num_go = len(op.ints("outputs_with_grads", ()))
            forward_inputs = op.inputs[num_go : len(op.inputs) - len(spec.aliases) - 1]
        if not (gradient and paired):
            for state in spec.states:
                local_node(state, STATE_STYLE)
            step_box = box.cluster(f"{here}:step_net", f"step net '{spec.step_net.name}'", STEP_CLUSTER)
            step = self.net(spec.step_net, step_box, f"{here}:step_net/")
            self._links(spec.links, step, external, "link")
            self._step_extras(spec, spec.links, step, here, in_ids, used)
            for state, index in zip(spec.states, spec.initial_ids, strict=True):
                if index < len(forward_inputs):
                    used.add("in:" + forward_inputs[index])
                    self.edge(in_ids[forward_inputs[index]], local[state], label="initial")
        if spec.backward_step_net is not None and (gradient or not paired):
            grads = [local_node(remapped_name(op, state + "_grad"), STATE_STYLE) for state in spec.states]
            name = spec.backward_step_net.name
            backward_box = box.cluster(f"{here}:backward_step_net", f"backward step net '{name}'", BACKWARD_CLUSTER)
            backward = self.net(spec.backward_step_net, backward_box, f"{here}:backward_step_net/")
            backward_links = decode_links(op, "backward_")
            self._links(backward_links, backward, external, "backward link")
            self._step_extras(spec, (*spec.links, *backward_links), backward, here, in_ids, used)
            params = op.ints("param", ())
            if gradient and len(op.outputs) == 1 + len(params) + len(spec.states):
                # outputs: the input sequence's gradient (a backward link), the parameters', the initial states'
                for name, output in zip(op.strings("param_grads", ()), op.outputs[1:], strict=False):
                    connect(backward.read(remapped_name(op, name)), output, "param grad")
                for node, output in zip(grads, op.outputs[1 + len(params) :], strict=True):
                    connect(node, output, "initial")
        if not gradient:
            for alias in spec.aliases:
                self.edge(external(alias.src, False), external(alias.dst, True), label=f"alias offset {alias.offset}")
        for name, node in in_ids.items():
            if "in:" + name not in used:
                self.edge(node, here)
        for name, node in out_ids.items():
            if "out:" + name not in used:
                self.edge(here, node)

    def _links(self, links: tuple[Link, ...], blobs: _Blobs, external, what: str) -> None:
        for link in links:
            label = f"{what} offset {link.offset}" + (f", window {link.window}" if link.window != 1 else "")
            written = blobs.written(link.internal)
            if link.internal in blobs.read_first or not written:
                self.edge(external(link.external, False), blobs.first(link.internal), label=label)
            if written:
                self.edge(blobs.read(link.internal), external(link.external, True), label=label)

    def _step_extras(
        self, spec: RecurrentSpec, links: tuple[Link, ...], blobs: _Blobs, here: str, in_ids, used: set[str]
    ) -> None:
        """The timestep the op writes before each step, and the op inputs the step net reads by name."""
        if spec.timestep in blobs.read_first:
            self.edge(here, blobs.first(spec.timestep), label="timestep", style="dashed")
        linked = {link.internal for link in links}
        for name in sorted(blobs.read_first & set(in_ids) - linked - {spec.timestep}):
            used.add("in:" + name)
            self.edge(in_ids[name], blobs.first(name), label="shared", style="dotted")


def op_label(op: Op) -> str:
    """net_drawer's op label: `[name/]Type (op#I)`."""
    return f"{op.name}/{op.type} (op#{op.index})" if op.name else f"{op.type} (op#{op.index})"


RANKDIRS = ("TB", "LR")


def to_dot(net: Net, rankdir: str = "TB") -> str:
    """The net as DOT text (see the module docstring for its node ids and edges)."""
    root = _Graph(net.name or "net", {"rankdir": rankdir, "fontname": "Helvetica"})
    drawer = _Drawer()
    drawer.net(net, root, "")
    lines = [f"digraph {quote(root.name)} {{"]
    lines.append('  node [fontname="Helvetica", fontsize="11"];')
    lines.append('  edge [fontname="Helvetica", fontsize="9"];')
    lines += root.lines("  ")
    lines += [f"  {edge};" for edge in drawer.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"
