"""`rnn2jax codegen NET [--init INIT | --params P.npz] -o model.py`: the net and its parameters, loaded
as `rnn2jax run` loads them, written as a standalone JAX module and the .npz beside it."""

from __future__ import annotations

from collections.abc import Sequence

from ..compiler.compiled_net import as_net
from ..serving.codegen import check_ops, generate, module_path, write_module
from .commands import compile_with_params
from .predictor import export_db_type
from .progress import stage


def codegen(
    net: str,
    init: str | None,
    params: str | None,
    output: str,
    db_root: str | None = None,
    db_type: str | None = None,
    inputs: Sequence[str] = (),
) -> int:
    """The module has no fixed shapes, as an export with symbolic `--batch N --steps T` has none: what the
    init net fills and those decide the shape of (its one-sample data) is an input of `apply`, like the
    blobs named in `inputs` (rnn2jax/checking/input_rule.py)."""
    module_path(output)
    if export_db_type(net, db_type) is None:  # a net file: name every op codegen lacks before compiling
        check_ops(as_net(net))
    fn = compile_with_params(net, init, params, db_root=db_root, db_type=db_type, inputs=inputs, batch="N", steps="T")
    with stage(f"generating code for {len(fn.net.ops)} ops"):
        source, saved = generate(fn.net, fn.params)
    path = write_module(output, source, saved)
    print(f"wrote {path} and {path.with_suffix('.npz')} ({len(saved)} parameters)")
    return 0
