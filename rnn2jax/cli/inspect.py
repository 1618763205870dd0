"""`rnn2jax inspect NET...`: a net's ops, recurrent ops and unsupported ops; a plan's nets; a Caffe2 DB's
blobs (and a predictor export's nets, inputs and outputs)."""

from __future__ import annotations

import argparse

from . import arguments

NAME = "inspect"
HELP = "list a net's ops, recurrent ops and unsupported ops, or a Caffe2 DB's blobs"
DESCRIPTION = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.model(
        parser, "--db-type", dest="nets", nargs="+", help="a NetDef or PlanDef file (.pb or .pbtxt), or a Caffe2 DB"
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from ..ir.loader import load
    from .db import guess_db_type, inspect_db
    from .predictor import inspect_export
    from .summary import describe

    for path in args.nets:
        db_type = args.db_type or guess_db_type(path)
        if db_type is not None:
            print(inspect_db(path, db_type))
            export = inspect_export(path, db_type)
            if export:
                print(export)
            continue
        print(describe(load(path), title=path))
    return 0
