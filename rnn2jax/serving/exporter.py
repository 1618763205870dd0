"""A compiled net as a standard `jax.export.Exported`: what `rnn2jax export` serializes.

The exported function takes a dict of named inputs (blob name -> array) and returns a dict of named
outputs, so any JAX program runs the file with `jax.export.deserialize(...).call(inputs)`; with the
parameters as an argument it is `f(params, inputs)`, so one artifact serves several weight sets. A dim
may be a symbol (jax.export shape polymorphism): every input shares one `SymbolicScope`, so `N` in two
inputs is the same size, and the artifact runs at any size >= 1 for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..compiler.compiled_net import CompiledNet
from ..errors import Advice, BadArgumentError, Rnn2JaxError, ShapeError
from ..ir.dtypes import in_caffe2_dtypes
from ..native import disabled as native_kernels_disabled

# What jax.export lowers for (its names; "gpu" is not one: CUDA and ROCm are lowered separately).
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
DEFAULT_PLATFORMS = ("cpu", "cuda")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Dim = int | str


def parse_platforms(text: str | Sequence[str]) -> tuple[str, ...]:
    """`cpu,cuda,tpu` as jax.export's platform names, in order, each once; unknown names are refused."""
    names = [p.strip().lower() for p in (text.split(",") if isinstance(text, str) else text)]
    names = list(dict.fromkeys(p for p in names if p))
    unknown = [p for p in names if p not in PLATFORMS]
    if unknown or not names:
        raise BadArgumentError(
            f"--platforms {','.join(unknown) or '(none)'}: "
            f"{'unknown platform' if unknown else 'no platform given'}; choose from {', '.join(PLATFORMS)}"
        )
    return tuple(names)


def parse_dim(text: str) -> Dim:
    """A dim as given on the command line: a size (>= 0) or a symbol name (a size >= 1 chosen per call)."""
    text = text.strip()
    if _SYMBOL.match(text):
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"dim {text!r} is neither a size (>= 0) nor a symbol name (like T or N)")
    return value


def input_specs(shapes: Mapping[str, Sequence[Dim]], dtypes: Mapping[str, Any]) -> dict[str, jax.ShapeDtypeStruct]:
    """Abstract inputs for `jax.export` (dtypes already checked): one `SymbolicScope` for every symbol of
    every input, so a symbol is one size wherever it appears."""
    scope = jax.export.SymbolicScope()
    specs = {}
    for name, dims in shapes.items():
        text = ",".join(str(d) for d in dims)
        shape = jax.export.symbolic_shape(text, scope=scope) if any(isinstance(d, str) for d in dims) else dims
        specs[name] = jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtypes[name]))
    return specs


@in_caffe2_dtypes
def export_net(
    fn: CompiledNet,
    specs: Mapping[str, jax.ShapeDtypeStruct],
    *,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    params_as_input: bool = False,
) -> jax.export.Exported:
    """`fn` traced once for `specs` and lowered for every platform. The parameters are constants of the
    StableHLO unless `params_as_input`; those whose values decide shapes stay constants either way.
    64-bit inputs, parameters and outputs keep their dtypes: the artifact's caller needs x64 for them
    (`load_exported` turns it on for its calls)."""
    _refuse_static_inputs(fn)
    static = fn.static_params
    names = fn.output_names

    if params_as_input:  # the parameters the net reads (an init net may write more), less the static ones
        read = fn.first_reader
        params = {
            n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in fn.params.items() if n in read and n not in static
        }

        def rnn2jax_net(params: dict[str, jax.Array], inputs: dict[str, jax.Array]) -> dict[str, jax.Array]:
            outputs = fn.apply({**params, **static}, inputs)
            return {n: outputs[n] for n in names}

        args: tuple[Any, ...] = (params, dict(specs))
    else:
        constants = {**fn.params, **static}

        def rnn2jax_net(inputs: dict[str, jax.Array]) -> dict[str, jax.Array]:
            outputs = fn.apply(constants, inputs)
            return {n: outputs[n] for n in names}

        args = (dict(specs),)
    try:
        # the pure lowering only: a serialized model runs anywhere, without this package's kernel library
        with native_kernels_disabled():
            return jax.export.export(jax.jit(rnn2jax_net), platforms=tuple(platforms))(*args)
    except Rnn2JaxError:
        raise  # an op's error, with the op and blob named (lower.py)
    except jax.errors.InconclusiveDimensionOperation as error:
        raise ShapeError(
            f"{fn.net.where}: cannot be exported with symbolic dims: {_first_line(error)}",
            advice=Advice("give those dims sizes in the input specs", "give those dims sizes in --shape"),
        ) from None
    except (NotImplementedError, ValueError) as error:  # jax's lowering, e.g. a primitive one platform lacks
        raise Rnn2JaxError(f"{fn.net.where}: cannot export for {', '.join(platforms)}: {_first_line(error)}") from None


def _refuse_static_inputs(fn: CompiledNet) -> None:
    """Inputs whose values decide shapes cannot be arguments of an export: name them and their reader."""
    if not fn.static_inputs:
        return
    readers = fn.static_readers
    named = "; ".join(f"'{n}' decides a shape in {readers[n].where}" for n in fn.static_inputs)
    raise ShapeError(
        f"{fn.net.where}: input(s) {', '.join(fn.static_inputs)} decide output shapes by their values ({named}), "
        "so an export cannot take them as arguments",
        advice=Advice(
            "give their values as parameters (compile(..., params=)) to bake them in",
            "give their values with --params to bake them in",
        ),
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
