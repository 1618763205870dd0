"""`rnn2jax convert-params DB -o params.npz` (or `-o DIR`, an Orbax checkpoint): a Caffe2 DB's tensors,
for `--params` or for JAX."""

from __future__ import annotations

import argparse

from . import arguments

NAME = "convert-params"
HELP = "write a Caffe2 DB's tensors to an .npz file or an Orbax checkpoint directory"
DESCRIPTION = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(parser, "--db-type", dest="db", metavar="DB", help="a Caffe2 DB (what Save wrote)")
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUT",
        help="PARAMS.npz, or a new directory for an Orbax checkpoint (needs the orbax extra)",
    )  # fmt: skip
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from .db import convert_params, guess_db_type, report_skipped

    db_type = args.db_type or guess_db_type(args.db) or "minidb"  # minidb: what a missing DB is reported as
    report_skipped(convert_params(args.db, db_type, args.output))
    return 0
