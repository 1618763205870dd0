"""A real Caffe2 net on an accelerator against the CPU: the breadbread character LSTM, exported and compiled.

    python benchmarks/accelerator_check.py prepare DIR [--steps 50 --batch 32]   # on the CPU machine
    python benchmarks/accelerator_check.py check DIR [--out RESULT.json]         # where the GPU is

`prepare` (needs the real nets beside the project, ../shared/realnets) writes into DIR: the breadbread
predict net as a binary NetDef, random parameters and inputs at its real widths (vocabulary 62, hidden 100;
tests/helpers.write_breadbread_run), the `rnn2jax export --platforms cpu,cuda` artifact of it, and the
reference: its outputs and the gradients of `sum(output * cotangent)` to every parameter and to the input
sequence, computed on this CPU by `rnn2jax.compile` (the native CPU kernels, forward and backward, where they
are in use: the accelerator lowers the `lax.scan` instead, so the two sides share no recurrence code).

`check` runs on `jax.devices()[0]`: the exported artifact (the file alone, no rnn2jax needed to call it), and
the net compiled there by `rnn2jax.compile`, forward and `jax.grad`; each compared with the CPU reference,
|a - b| <= 1e-6 * max(1, max|b|) + 1e-5 * |b| (the largest normalised error is reported, 1.0 = at the
tolerance), then timed (median of 20 calls after the first; compile time is the first call's). It prints a
JSON summary and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rnn2jax
from rnn2jax.proto import caffe2_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-6
NET, PARAMS, INPUTS, EXPORT, REFERENCE = "predict_net.pb", "params.npz", "inputs.npz", "export.bin", "cpu.npz"


def _loss(compiled, cotangents):
    def loss(params, inputs):
        out = compiled.apply(params, inputs)
        return sum(jnp.sum(out[name] * ct) for name, ct in cotangents.items())

    return loss


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def prepare(folder: Path, steps: int, batch: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from google.protobuf import text_format

    from helpers import BREADBREAD_HIDDEN, BREADBREAD_PREDICT_NET, BREADBREAD_VOCAB, write_breadbread_run
    from rnn2jax.native import library

    if not BREADBREAD_PREDICT_NET.exists():
        raise SystemExit(f"the breadbread net is absent ({BREADBREAD_PREDICT_NET})")
    folder.mkdir(parents=True, exist_ok=True)
    write_breadbread_run(folder, steps, batch)
    net = text_format.Parse(BREADBREAD_PREDICT_NET.read_text(), pb.NetDef())
    (folder / NET).write_bytes(net.SerializeToString())
    shapes = {
        "input_blob": (steps, batch, BREADBREAD_VOCAB),
        "seq_lengths": (batch,),
        "hidden_init": (1, batch, BREADBREAD_HIDDEN),
        "cell_init": (1, batch, BREADBREAD_HIDDEN),
    }
    command = [sys.executable, "-m", "rnn2jax", "export", str(folder / NET), "--params", str(folder / PARAMS)]
    command += [f"--shape={name}={','.join(map(str, shape))}" for name, shape in shapes.items()]
    command += ["--platforms", "cpu,cuda", "-o", str(folder / EXPORT)]
    subprocess.run(command, check=True)

    params, inputs = _npz(folder / PARAMS), _npz(folder / INPUTS)
    compiled = rnn2jax.compile(net, params=params)
    outputs = {k: np.asarray(v) for k, v in compiled(inputs).items()}
    rng = np.random.default_rng(1)
    cotangents = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in outputs.items()}
    differentiable = {"input_blob": inputs["input_blob"]}
    rest = {k: v for k, v in inputs.items() if k not in differentiable}
    loss = _loss(compiled, cotangents)
    grads = jax.jit(jax.grad(lambda p, d: loss(p, {**rest, **d}), argnums=(0, 1)))(compiled.params, differentiable)
    reference = {f"out/{k}": v for k, v in outputs.items()}
    reference |= {f"cotangent/{k}": v for k, v in cotangents.items()}
    reference |= {f"grad/{k}": np.asarray(v) for part in grads for k, v in part.items()}
    np.savez(folder / REFERENCE, **reference)
    print(f"wrote {folder}: reference on {jax.devices()[0].device_kind}, {library.status().describe()}")


def _error(got, want) -> float:
    """The largest |got - want| over its tolerance (1.0 = at the tolerance)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    return float(np.max(np.abs(got - want) / (ATOL * scale + RTOL * np.abs(want)))) if want.size else 0.0


def _timed(fn, *args) -> dict[str, float]:
    begin = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - begin
    times = []
    for _ in range(20):
        begin = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - begin)
    return {"first_call_s": round(first, 3), "median_ms": round(1e3 * statistics.median(times), 3)}


def check(folder: Path) -> dict:
    device = jax.devices()[0]
    params, inputs, reference = _npz(folder / PARAMS), _npz(folder / INPUTS), _npz(folder / REFERENCE)
    on_device = jax.device_put({k: jnp.asarray(v) for k, v in inputs.items()}, device)
    outputs = [k.split("/", 1)[1] for k in reference if k.startswith("out/")]
    result: dict = {"device": str(device), "device_kind": device.device_kind, "jax": jax.__version__}

    exported = jax.export.deserialize(bytearray((folder / EXPORT).read_bytes()))
    served = jax.jit(exported.call)
    timing = _timed(served, on_device)  # first: its first call is the compile
    ran = served(on_device)
    result["export"] = {
        "platforms": list(exported.platforms),
        "max_error": {name: _error(ran[name], reference[f"out/{name}"]) for name in outputs},
        **timing,
    }

    net = pb.NetDef.FromString((folder / NET).read_bytes())
    compiled = rnn2jax.compile(net, params=params)
    device_params = jax.device_put(compiled.params, device)
    forward = jax.jit(compiled.apply)
    timing = _timed(forward, device_params, on_device)
    got = forward(device_params, on_device)
    result["compiled_forward"] = {
        "max_error": {name: _error(got[name], reference[f"out/{name}"]) for name in outputs},
        **timing,
    }
    cotangents = {name: jnp.asarray(reference[f"cotangent/{name}"]) for name in outputs}
    loss = _loss(compiled, cotangents)
    differentiable = {"input_blob": on_device["input_blob"]}
    rest = {k: v for k, v in on_device.items() if k not in differentiable}
    grad = jax.jit(jax.grad(lambda p, d: loss(p, {**rest, **d}), argnums=(0, 1)))
    timing = _timed(grad, device_params, differentiable)
    grads = {k: v for part in grad(device_params, differentiable) for k, v in part.items()}
    result["compiled_grad"] = {
        "max_error": {name: _error(grads[name], reference[f"grad/{name}"]) for name in grads},
        **timing,
    }
    errors = [e for key in ("export", "compiled_forward", "compiled_grad") for e in result[key]["max_error"].values()]
    result["all_within_tolerance"] = all(e <= 1.0 for e in errors)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("prepare", "check"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.stage == "prepare":
        prepare(args.folder, args.steps, args.batch)
        return
    result = check(args.folder)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    if not result["all_within_tolerance"]:
        raise SystemExit("the accelerator's results differ from the CPU's beyond the tolerance")


if __name__ == "__main__":
    main()
