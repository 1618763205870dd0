"""`rnn2jax draw NET`: a net as a Graphviz picture in the look of Caffe2's `net_drawer`, each RecurrentNetwork
a box holding its step nets (the DOT text is built in dot.py). `.dot` needs nothing; `.svg`, `.png` and
`.pdf` go through the `graphviz` package (the `draw` extra) and Graphviz's `dot` program."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ParseError, Rnn2JaxError
from . import arguments

if TYPE_CHECKING:
    from ..ir.netdef import Net, Plan

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf"}  # besides .dot/.gv, written without Graphviz

NAME = "draw"
HELP = "draw a net as SVG/PNG/PDF/DOT: each RecurrentNetwork a box holding its step nets, links as edges"
DESCRIPTION = """Draw NET as Caffe2's net_drawer did (ops as boxes, blobs as ellipses), each RecurrentNetwork as a
box holding its step net and backward step net, with its links, aliases and recurrent states as labelled edges. Of a
plan it draws the net --net names, else the one with a RecurrentNetwork (the training net first). .svg, .png and .pdf
need the draw extra and Graphviz's dot; .dot needs nothing."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser, "--net", help="a NetDef or PlanDef file (.pb or .pbtxt)")
    parser.add_argument(
        "-o", "--output", metavar="OUT",
        help="OUT.svg, .png, .pdf or .dot; - prints the DOT (default: NET's file name as .svg, here)",
    )  # fmt: skip
    parser.add_argument(
        "--rankdir", choices=("TB", "LR"), default="TB", help="top to bottom (default) or left to right (net_drawer's)"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return draw(args.net, args.output, args.net_name, args.rankdir)


def choose_net(loaded: Net | Plan, name: str | None, source: str) -> Net:
    """The net to draw: `name`, else for a plan the net holding a RecurrentNetwork (the training one, with
    gradient ops, first), else its only net, else the one holding gradient ops."""
    from ..ir.netdef import Net

    if isinstance(loaded, Net):
        if name is not None and name != loaded.name:
            raise ParseError(f"{source} holds one net, '{loaded.name}', not '{name}'")
        return loaded
    if name is not None:
        return loaded[name]
    nets = list(loaded.nets.values())
    recurrent = [n for n in nets if any(op.type == "RecurrentNetwork" for op in n.ops)]
    training = [n for n in nets if any(op.is_gradient_op or op.type.endswith("Gradient") for op in n.ops)]
    both = [n for n in recurrent if any(n is t for t in training)]
    for candidates in (both, recurrent, nets if len(nets) == 1 else [], training):
        if candidates:
            return candidates[0]
    raise ParseError(
        f"plan '{loaded.name}' in {source} has no net with a RecurrentNetwork or gradient ops: choose one with "
        f"--net ({', '.join(loaded.nets) or 'it has no nets'})"
    )


def render(dot: str, fmt: str) -> bytes:
    """DOT text laid out by Graphviz's `dot` as `fmt` (svg, png, pdf)."""
    try:
        import graphviz
    except ImportError:
        raise Rnn2JaxError(
            f"writing {fmt} needs the graphviz Python package: pip install 'rnn2jax[draw]' "
            "(or write a .dot file, which needs nothing)"
        ) from None
    try:
        return graphviz.pipe("dot", fmt, dot.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound:
        raise Rnn2JaxError(
            f"writing {fmt} needs Graphviz's `dot` program, which is not on PATH: install Graphviz "
            "(apt-get install graphviz, brew install graphviz, or https://graphviz.org/download/), "
            "or write a .dot file"
        ) from None
    except graphviz.CalledProcessError as error:
        detail = (error.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise Rnn2JaxError(f"Graphviz's dot failed: {detail[-1] if detail else error}") from None


def draw(source: str, output: str | None = None, net_name: str | None = None, rankdir: str = "TB") -> int:
    """`rnn2jax draw`: write the picture (format from the suffix; default `<NET>.svg` here), or the DOT
    text to stdout for `-o -`."""
    from ..ir.files import atomic_write
    from ..ir.loader import load
    from .dot import RECURRENT_OPS, to_dot

    net = choose_net(load(source), net_name, source)
    dot = to_dot(net, rankdir)
    if output == "-":
        print(dot, end="")
        return 0
    path = output if output is not None else Path(source).stem + ".svg"
    suffix = Path(path).suffix.lower()
    if suffix in (".dot", ".gv"):
        data = dot.encode("utf-8")
    elif suffix in FORMATS:
        data = render(dot, FORMATS[suffix])
    else:
        raise Rnn2JaxError(f"cannot draw to '{path}': give a .svg, .png, .pdf or .dot file")
    try:
        with atomic_write(path) as file:
            file.write(data)
    except OSError as error:
        raise ParseError(f"cannot write '{os.fspath(path)}': {error.strerror or error}") from None
    recurrent = sum(op.type in RECURRENT_OPS for op in net.ops)
    print(f"wrote {path}: net '{net.name}', {len(net.ops)} ops, {recurrent} recurrent")
    return 0
