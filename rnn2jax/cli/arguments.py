"""The command line's one vocabulary: every flag that several commands take is defined once here, in one of
four argument groups that `--help` shows under the same title in every command that has it:

- model: NET and what makes it runnable (`--net`, `--init`, `--params`, `--db-root`, `--db-type`);
- input shapes: `--shape BLOB=D0,D1,...` (also spelt `--input-shape`), `--batch N`, `--steps T`;
- input values: `--input BLOB=FILE.npy`, `--inputs FILE.npz`;
- real Caffe2: `--caffe2 [PYTHON]`.

A command takes the flags of a group it needs and no flag with another meaning: a flag has one dest, type,
metavar and help wherever it appears (tests/cli/test_cli_vocabulary.py checks every command). What differs
between commands (export's symbolic dims, say) is said in the group's description, not in the flag.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ..errors import BadArgumentError

# ------------------------------------------------------------------------------------------------
# Values


def dim(text: str) -> int | str:
    """A dim: a size, or a symbol name (T, N) that `export` keeps symbolic and the other commands refuse."""
    from ..serving.exporter import parse_dim  # jax's, so only when a shape is given

    try:
        return parse_dim(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def shape(text: str) -> tuple[str, tuple[int | str, ...]]:
    """`BLOB=D0,D1,...` as (blob, dims); `BLOB=` is a scalar."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected BLOB=D0,D1,... (sizes, or symbols like T and N), got {text!r}")
    return name, tuple(dim(d) for d in dims.split(",") if d.strip())


def size(text: str) -> int | str:
    """A batch size or sequence length: a positive size, or a symbol name."""
    value = dim(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive size or a symbol (like T or N), got {text!r}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def name_value(text: str) -> tuple[str, str]:
    """`BLOB=VALUE` as (blob, value); the blob name may not hold '=', the value may."""
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected BLOB=VALUE, got {text!r}")
    return name, value


# ------------------------------------------------------------------------------------------------
# Flags and groups


@dataclass(frozen=True)
class Flag:
    """One flag, defined once: its spellings (the first is its name; the others, old spellings, keep
    working) and its argparse keywords."""

    spellings: tuple[str, ...]
    options: dict[str, Any]

    def add_to(self, group: argparse._ActionsContainer) -> argparse.Action:
        return group.add_argument(*self.spellings, **self.options)


def _flag(*spellings: str, **options: Any) -> Flag:
    return Flag(spellings, options)


OPS_HELP = (
    "import MODULE (a dotted module name or a .py file) first: it registers user ops with rnn2jax.register_op "
    "(repeatable; before or after the command)"
)

NO_CACHE_HELP = (
    "compile without JAX's persistent compilation cache (by default executables are kept in $RNN2JAX_CACHE_DIR, "
    "else ~/.cache/rnn2jax/jax, so the next run of the same net compiles nothing)"
)

FLAGS: dict[str, Flag] = {
    # the model
    "--net": _flag(
        "--net", dest="net_name", metavar="NAME", help="the net to use when NET is a plan (PlanDef) of several nets"
    ),
    "--init": _flag(
        "--init",
        metavar="INIT",
        help="the init net that creates the parameters: a NetDef file, or the name of another net of NET's plan",
    ),
    "--params": _flag(
        "--params", metavar="P.npz", help="parameters by blob name, from an .npz file (they win over the init net's)"
    ),
    "--db-root": _flag(
        "--db-root",
        metavar="DIR",
        help="where the databases are that the init net or plan reads by relative name (Load); default: here",
    ),
    "--db-type": _flag(
        "--db-type",
        metavar="TYPE",
        help="the type of the Caffe2 DB the command reads, when NET or DB is one (a predictor export or a "
        "parameter DB): minidb, lmdb, leveldb or rocksdb; without it a DB is recognised by its content",
    ),
    # input shapes
    "--shape": _flag(
        "--shape",
        "--input-shape",
        dest="shape",
        action="append",
        type=shape,
        metavar="BLOB=D0,D1,...",
        help="an input's shape (repeatable); shapes not given are inferred from the others, the parameters "
        "and --batch/--steps",
    ),
    "--batch": _flag(
        "--batch", type=size, metavar="N", help="the batch size: with --steps, decides the shapes not given"
    ),
    "--steps": _flag("--steps", type=size, metavar="T", help="the sequence length (see --batch)"),
    # input values
    "--input": _flag(
        "--input",
        action="append",
        type=name_value,
        metavar="BLOB=FILE.npy",
        help="an input's value, from an .npy file (repeatable)",
    ),
    "--inputs": _flag("--inputs", metavar="FILE.npz", help="input values by blob name, from an .npz file"),
    # real Caffe2
    "--caffe2": _flag(
        "--caffe2",
        nargs="?",
        const="",
        metavar="PYTHON",
        help="real Caffe2: the Python of its venv (what `rnn2jax setup-caffe2` printed); alone, "
        "$RNN2JAX_CAFFE2_PYTHON or else the venv setup-caffe2 made at its default place",
    ),
    # the checks' reports
    "--seed": _flag(
        "--seed", type=int, default=0, metavar="SEED", help="seeds random inputs and the init net's fills (default 0)"
    ),
    "--json": _flag("--json", action="store_true", help="print the report as JSON"),
    # every command: user ops (the top-level parser has the same flag, for before the command)
    "--ops": _flag("--ops", action="append", dest="ops_after", metavar="MODULE", help=OPS_HELP),
    "--no-cache": _flag("--no-cache", action="store_true", dest="no_cache_after", help=NO_CACHE_HELP),
}


@dataclass(frozen=True)
class Group:
    """An argument group: its title in `--help` and the flags it may hold."""

    title: str
    flags: tuple[str, ...]


MODEL, SHAPES, INPUTS, CAFFE2 = "model", "input shapes", "input values", "real Caffe2"
GROUPS: dict[str, Group] = {
    MODEL: Group(MODEL, ("--net", "--init", "--params", "--db-root", "--db-type")),
    SHAPES: Group(SHAPES, ("--shape", "--batch", "--steps")),
    INPUTS: Group(INPUTS, ("--input", "--inputs")),
    CAFFE2: Group(CAFFE2, ("--caffe2",)),
}


def group(
    parser: argparse.ArgumentParser,
    name: str,
    *flags: str,
    description: str | None = None,
    positional: tuple[str, dict[str, Any]] | None = None,
) -> argparse._ArgumentGroup:
    """The group `name` in `parser`: its `positional` argument first where it has one, then `flags` (all of
    the group's when none are named)."""
    known = GROUPS[name]
    wrong = [f for f in flags if f not in known.flags]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} not in group {name!r} ({', '.join(known.flags)})")
    added = parser.add_argument_group(known.title, description)
    if positional is not None:
        added.add_argument(positional[0], **positional[1])
    for flag in flags or known.flags:
        FLAGS[flag].add_to(added)
    return added


def model(
    parser: argparse.ArgumentParser,
    *flags: str,
    dest: str = "net",
    metavar: str = "NET",
    nargs: str | None = None,
    help: str = "a NetDef or PlanDef file (.pb or .pbtxt), or a predictor export (a Caffe2 DB)",
) -> argparse._ArgumentGroup:
    """The model group: the command's positional NET (or DB, PLAN) first, then `flags` (all by default)."""
    return group(parser, MODEL, *flags, positional=(dest, {"metavar": metavar, "nargs": nargs, "help": help}))


def add(parser: argparse._ActionsContainer, *flags: str) -> None:
    """Shared flags that belong to no group (`--seed`, `--json`)."""
    for flag in flags:
        FLAGS[flag].add_to(parser)


def command(
    commands: argparse._SubParsersAction, name: str, *, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A command's parser: its help line in `rnn2jax --help`, its description (argparse folds its line breaks
    and wraps it to the terminal), `--ops` and `--no-cache`."""
    parser = commands.add_parser(name, help=help, description=description)
    add(parser, "--ops")
    add(parser, "--no-cache")
    return parser


# ------------------------------------------------------------------------------------------------
# Parsing


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser that names the nearest known flag (or command) when given an unknown one."""

    def error(self, message: str) -> NoReturn:
        chosen = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if chosen:
            listed = chosen.group(2)  # quoted up to Python 3.11, bare after
            choices = re.findall(r"'([^']*)'", listed) or [c.strip() for c in listed.split(",")]
            near = difflib.get_close_matches(chosen.group(1), choices, n=1)
            message += f"; did you mean {near[0]}?" if near else ""
        super().error(message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = _command_parser(self, getattr(parsed, "command", None))
            parser.error(unknown_message(extras, [self, parser]))
        return parsed


def _command_parser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def unknown_message(extras: Sequence[str], parsers: Sequence[argparse.ArgumentParser]) -> str:
    """`unknown flag --input-shapes; did you mean --input-shape?`, for each unknown flag; other leftover
    words are named as unexpected."""
    shown = [a for p in parsers for a in p._actions if a.help != argparse.SUPPRESS]  # not hidden old spellings
    known = sorted({s for a in shown for s in a.option_strings if s.startswith("--")})
    parts = []
    for extra in extras:
        if not extra.startswith("-"):
            parts.append(f"unexpected argument {extra!r}")
            continue
        flag = extra.split("=", 1)[0]
        near = difflib.get_close_matches(flag, known, n=1)
        parts.append(f"unknown flag {flag}" + (f"; did you mean {near[0]}?" if near else ""))
    return "; ".join(parts)


def sizes_only(args: argparse.Namespace, command: str) -> None:
    """Refuse a symbolic dim (T, N) in `--shape`/`--batch`/`--steps`: `command` makes arrays of real sizes."""
    for name, dims in getattr(args, "shape", None) or ():
        if any(isinstance(d, str) for d in dims):
            raise BadArgumentError(
                f"--shape {name}={','.join(map(str, dims))}: {command} makes arrays, so every dim is a size; "
                "symbols (T, N) are for `rnn2jax export`"
            )
    for flag in ("batch", "steps"):
        value = getattr(args, flag, None)
        if isinstance(value, str):
            raise BadArgumentError(
                f"--{flag} {value}: {command} makes arrays, so it is a size; symbols are for `rnn2jax export`"
            )
