"""LSTM forward on both cores: the batch split over two CPU devices vs one device with XLA's intra-op threads.

XLA CPU runs one program on one device, and spreads each dot over its intra-op thread pool: every
step of a scan then forks and joins the pool, for matmuls of a few dozen rows. Declaring two host devices
(`jax_num_cpu_devices`, the same as `--xla_force_host_platform_device_count`) and splitting the batch
gives each core a scan of its own over half the rows: RNN steps never mix batch rows, so the devices never
wait for each other inside the loop. This script times, in one process, interleaved:

- `one`: the compiled Caffe2 net (rnn_cell.LSTM) jitted on device 0, all inputs there;
- `mesh`: `rnn2jax.compile(..., mesh=Mesh(2 devices))`, i.e. GSPMD partitioning of the batch axis;
- `shard_map`: `jax.shard_map` of the net's `apply` over the batch, each device running its own scan;
- `torch` (with --torch): `torch.nn.LSTM` with the same weights, 2 threads, timed after the others
  (its OpenMP threads spin after each call and would slow whatever ran next).

The number of host devices must be set before JAX creates its backends, so it is set here at start-up,
before any JAX operation. Outputs are checked equal before timing. Ratios are per round (variant / `one`).

    python benchmarks/two_devices.py [--rounds 21] [--sizes 50,32,256 100,64,512 200,16,128 20,128,1024]
"""

from __future__ import annotations

import argparse
import statistics
import time

SIZES = ["50,32,256", "100,64,512", "200,16,128", "20,128,1024"]


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--sizes", nargs="+", default=SIZES, help="T,N,H (input dim = H)")
    parser.add_argument("--variants", default="one,mesh,shard_map", help="comma-separated, first is the baseline")
    parser.add_argument("--torch", action="store_true", help="also time torch.nn.LSTM (2 threads)")
    parser.add_argument("--layers", type=int, default=1, help="stacked LSTM layers (rnn_cell.LSTM dim_out list)")
    return parser.parse_args()


ARGS = _parse_args()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)  # before any JAX operation creates the CPU backend

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import rnn2jax  # noqa: E402
from rnn2jax.caffe2.python.model_helper import ModelHelper  # noqa: E402
from rnn2jax.caffe2.python.rnn_cell import LSTM  # noqa: E402
from rnn2jax.compiler.sharding import batch_specs  # noqa: E402


def caffe2_lstm_net(dim_in: int, hidden: int, layers: int):
    """The NetDef Caffe2's rnn_cell.LSTM built (a MultiRNNCell for several layers), its init net and the
    last layer's hidden_state_all and hidden_state_last."""
    model = ModelHelper(name="bench")
    dims = hidden if layers == 1 else [hidden] * layers
    result = LSTM(model, "x", "seq_lengths", None, dim_in, dims, scope="lstm", forward_only=True)
    return model.net.Proto(), model.param_init_net.Proto(), [str(result[0]), str(result[1])]


def _torch(fn, x: np.ndarray, hidden: int, layers: int):
    import torch

    torch.set_num_threads(2)
    lstm = torch.nn.LSTM(x.shape[-1], hidden, num_layers=layers)
    order = np.concatenate([np.arange(k * hidden, (k + 1) * hidden) for k in (0, 1, 3, 2)])
    with torch.no_grad():
        for layer in range(layers):
            prefix = "lstm/" if layers == 1 else f"lstm/layer_{layer}/"
            names = {"weight_ih": "i2h_w", "bias_ih": "i2h_b", "weight_hh": "gates_t_w", "bias_hh": "gates_t_b"}
            for ours_is, name in names.items():
                value = np.asarray(fn.params[_param(fn, prefix, name, layer)])[order]
                getattr(lstm, f"{ours_is}_l{layer}").copy_(torch.from_numpy(value))
    tx = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return lstm(tx)[0].numpy()

    return run


def _param(fn, prefix: str, name: str, layer: int) -> str:
    # MultiRNNCell keeps layer 0's input projection (i2h) outside the step net, under the scope itself
    for candidate in (prefix + name, f"lstm/{name}" if layer == 0 else ""):
        if candidate in fn.params:
            return candidate
    raise KeyError(f"{prefix}{name} not in {sorted(fn.params)}")


def benchmark(steps: int, batch: int, hidden: int) -> list[str]:
    devices = jax.devices()
    mesh = Mesh(np.array(devices[:2]), ("batch",))
    predict, init, outputs = caffe2_lstm_net(hidden, hidden, ARGS.layers)
    fn = rnn2jax.compile(predict, init_net=init, outputs=outputs)
    meshed = rnn2jax.compile(predict, init_net=init, outputs=outputs, mesh=mesh)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
    host = {"x": x, "seq_lengths": np.full(batch, steps, np.int32)}
    one_inputs = {k: jax.device_put(v, devices[0]) for k, v in host.items()}
    one_params = {k: jax.device_put(v, devices[0]) for k, v in fn.params.items()}
    one = jax.jit(fn.apply)
    in_specs = batch_specs(host)
    split = jax.jit(
        jax.shard_map(
            fn.apply, mesh=mesh, in_specs=(P(), in_specs), out_specs=batch_specs_out(outputs), check_vma=False
        )
    )
    split_inputs = {k: jax.device_put(v, NamedSharding(mesh, in_specs[k])) for k, v in host.items()}
    split_params = {k: jax.device_put(v, NamedSharding(mesh, P())) for k, v in fn.params.items()}
    runs = {
        "one": lambda: jax.block_until_ready(one(one_params, one_inputs)),
        "mesh": lambda: jax.block_until_ready(meshed(split_inputs)),
        "shard_map": lambda: jax.block_until_ready(split(split_params, split_inputs)),
    }
    runs = {name: runs[name] for name in ARGS.variants.split(",")}
    reference = np.asarray(runs["one"]()[outputs[0]]) if "one" in runs else None
    for name, run in runs.items():
        got = np.asarray(run()[outputs[0]])
        if reference is not None:
            np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6, err_msg=name)
    if ARGS.torch:
        run_torch = _torch(fn, x, hidden, ARGS.layers)
        np.testing.assert_allclose(run_torch(), reference, rtol=1e-3, atol=1e-4, err_msg="torch")
        runs["torch"] = run_torch
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ARGS.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = next(iter(runs))
    cells = []
    for name in runs:
        ratio = statistics.median(a / b for a, b in zip(times[name], times[base], strict=True))
        median, best = 1e3 * statistics.median(times[name]), 1e3 * min(times[name])
        cells.append(f"{name} {median:8.2f} ms ({ratio:.2f}) min {best:.2f}")
    return cells


def batch_specs_out(outputs: list[str]) -> dict[str, P]:
    """[T, N, H] and [1, N, H] outputs: batch at axis 1."""
    return {name: P(None, "batch") for name in outputs}


def main() -> None:
    print(
        f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, "
        f"{ARGS.layers} layer(s), {ARGS.rounds} interleaved rounds; median ms (median per-round ratio to first), min ms"
    )
    for size in ARGS.sizes:
        steps, batch, hidden = (int(v) for v in size.split(","))
        print(f"{size:>12}: " + "  ".join(benchmark(steps, batch, hidden)), flush=True)


if __name__ == "__main__":
    main()
