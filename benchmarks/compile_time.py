"""Compile time: how long a Caffe2 net takes to become an executable, stage by stage (issue 13, item 5).

Targets: the real dper net (176 ops) and a 4-layer LSTM encoder-decoder with attention (forward and
its training net) each compile in under 5 s; an LSTM's compile time is flat in T (T=1000 <= 1.5x T=50),
forward and training.

Stages, each timed on its own, after `jax.clear_caches()` (rnn2jax keeps no compile cache of its own
outside `caffe2.python.workspace`, which is not used here):
- prepare: `rnn2jax.compile(...)`: loading, checking and lowering the net, and running the init net;
- trace:   `jax.jit(f).trace(...)`: our kernels run on tracers, the jaxpr is built;
- lower:   `.lower()`: jaxpr -> StableHLO;
- xla:     `.compile()`: XLA's optimisation and code generation.
The total is their sum. Times are medians over `--repeats` fresh compilations.

    python benchmarks/compile_time.py [--repeats 3] [--only dper,seq2seq,lstm] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh compilations per net (median taken)")
    parser.add_argument("--only", default="dper,seq2seq,lstm", help="comma-separated subset of the cases")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for XLA")
    parser.add_argument("--hidden", type=int, default=256, help="state size of the LSTM nets")
    parser.add_argument("--batch", type=int, default=32, help="batch size N of the LSTM nets")
    parser.add_argument("--lengths", default="50,1000", help="the two T values of the flatness check")
    parser.add_argument("--profile", metavar="CASE", help="cProfile one compilation of CASE (e.g. seq2seq/train)")
    return parser.parse_args()


ARGS = _parse_args()
os.environ.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={ARGS.threads}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import rnn2jax  # noqa: E402
from rnn2jax.caffe2.python import rnn_cell  # noqa: E402
from rnn2jax.caffe2.python.attention import AttentionType  # noqa: E402
from rnn2jax.caffe2.python.model_helper import ModelHelper  # noqa: E402
from rnn2jax.caffe2.python.rnn_cell import AttentionCell  # noqa: E402
from rnn2jax.ops.backward_pass import get_backward_pass  # noqa: E402
from rnn2jax.proto import caffe2_pb2 as pb  # noqa: E402

LIMIT_S = 5.0  # the compile-time target per net
FLAT_RATIO = 1.5  # T=1000 may cost at most this times T=50
LAYERS = 4


# --------------------------------------------------------------------------------------------------
# The nets. Each case is (name, make) where make() returns (prepare, example) with prepare() the
# rnn2jax.compile call and example(compiled) -> (jitted function, its arguments).

Case = tuple[Callable[[], Any], Callable[[Any], tuple[Callable[..., Any], tuple]]]


def _training(forward: pb.NetDef, loss: str) -> pb.NetDef:
    """The forward net plus Caffe2's gradient ops for `loss` (the net a Caffe2 trainer ran)."""
    train = pb.NetDef()
    train.CopyFrom(forward)
    backward, _ = get_backward_pass(list(forward.op), {loss: None})
    train.op.extend(backward)
    return train


def _parameter_gradients(init: pb.NetDef) -> list[str]:
    """What a trainer fetches from the training net: the gradient of every parameter."""
    return [f"{name}_grad" for op in init.op for name in op.output]


def _jitted(compiled: Any, inputs: dict[str, np.ndarray]) -> tuple[Callable[..., Any], tuple]:
    """The jitted function `CompiledNet.__call__` runs, and its arguments (static inputs split off)."""
    static = {name: np.asarray(inputs[name]) for name in compiled.static_inputs}
    arrays = {name: jnp.asarray(value) for name, value in inputs.items() if name not in static}
    params = {k: v for k, v in compiled.params.items() if k not in compiled.static_params}
    return compiled._executable(static), (params, arrays)


def lstm_case(steps: int, training: bool) -> Case:
    """One rnn_cell.LSTM layer (input projection FC + RecurrentNetwork), summed into a loss."""
    hidden, batch = ARGS.hidden, ARGS.batch
    model = ModelHelper(name=f"lstm_{steps}")
    hidden_all, *_ = rnn_cell.LSTM(
        model, "x", "seq_lengths", ("h0", "c0"), hidden, hidden, scope="lstm", forward_only=not training
    )
    model.net.SumElements([hidden_all], "loss")
    forward = model.net.Proto()
    net = _training(forward, "loss") if training else forward
    init = model.param_init_net.Proto()
    outputs = ["loss", *_parameter_gradients(init)] if training else ["loss"]
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal((steps, batch, hidden)).astype(np.float32),
        "h0": np.zeros((1, batch, hidden), np.float32),
        "c0": np.zeros((1, batch, hidden), np.float32),
        "seq_lengths": np.full(batch, steps, np.int32),
    }
    return (lambda: rnn2jax.compile(net, init_net=init, outputs=outputs)), (lambda c: _jitted(c, inputs))


def seq2seq_case(training: bool, steps: int = 20) -> Case:
    """Caffe2's seq2seq model (models/seq2seq/seq2seq_util.py) at 4 layers: an encoder of 4 stacked
    LSTMs (rnn_cell.LSTM over a MultiRNNCell), and a decoder of 4 stacked LSTMCells in a MultiRNNCell
    under an AttentionCell (regular attention), started from the encoder's last states, then an
    output projection, softmax and cross-entropy."""
    hidden, batch, vocab = ARGS.hidden, ARGS.batch, 64
    model = ModelHelper(name="seq2seq")
    encoder = rnn_cell.LSTM(
        model,
        "encoder_inputs",
        "encoder_lengths",
        [name for i in range(LAYERS) for name in (f"enc_h0_{i}", f"enc_c0_{i}")],
        hidden,
        [hidden] * LAYERS,
        scope="encoder",
        forward_only=not training,
        return_last_layer_only=False,
        outputs_with_grads=(0,),
    )
    encoder_outputs = encoder[4 * (LAYERS - 1)]
    decoder_cells = [
        rnn_cell.LSTMCell(
            input_size=hidden, hidden_size=hidden, forget_bias=0.0, memory_optimization=False, forward_only=not training
        )
        for _ in range(LAYERS)
    ]
    cell = AttentionCell(
        encoder_output_dim=hidden,
        encoder_outputs=encoder_outputs,
        encoder_lengths="encoder_lengths",
        decoder_cell=rnn_cell.MultiRNNCell(decoder_cells, name="decoder"),
        decoder_state_dim=hidden,
        name="attention_decoder",
        attention_type=AttentionType.Regular,
        weighted_encoder_outputs=None,
        attention_memory_optimization=True,
        forward_only=not training,
    )
    states = [encoder[4 * i + k] for i in range(LAYERS) for k in (1, 3)] + ["initial_attention_context"]
    outputs_with_grads = [2 * (2 * (LAYERS - 1)), 2 * (2 * LAYERS)]  # top hidden state, attention context
    decoder_outputs, _ = cell.apply_over_sequence(
        model, "decoder_inputs", "decoder_lengths", states, outputs_with_grads=outputs_with_grads
    )
    flat, _ = model.net.Reshape([decoder_outputs], ["decoder_flat", "decoder_flat_shape"], shape=[-1, 2 * hidden])
    logits = model.net.FC([flat, "proj_w", "proj_b"], "logits")
    model.param_init_net.XavierFill([], "proj_w", shape=[vocab, 2 * hidden])
    model.param_init_net.ConstantFill([], "proj_b", shape=[vocab], value=0.0)
    softmax, loss = model.net.SoftmaxWithLoss([logits, "targets"], ["softmax", "loss"])
    forward = model.net.Proto()
    net = _training(forward, str(loss)) if training else forward
    init = model.param_init_net.Proto()
    outputs = ["loss", *_parameter_gradients(init)] if training else [str(softmax)]
    rng = np.random.default_rng(0)
    zeros = np.zeros((1, batch, hidden), np.float32)
    inputs = {
        "encoder_inputs": rng.standard_normal((steps, batch, hidden)).astype(np.float32),
        "encoder_lengths": np.full(batch, steps, np.int32),
        "decoder_inputs": rng.standard_normal((steps, batch, hidden)).astype(np.float32),
        "decoder_lengths": np.full(batch, steps, np.int32),
        "initial_attention_context": zeros,
        "targets": rng.integers(0, vocab, size=steps * batch).astype(np.int32),
        **{f"enc_{s}0_{i}": zeros for i in range(LAYERS) for s in "hc"},
    }
    return (lambda: rnn2jax.compile(net, init_net=init, outputs=outputs)), (lambda c: _jitted(c, inputs))


def dper_case() -> Case:
    """The real dper ads-ranking train net (176 ops, two LSTM pools), with tests/programs/test_dper_net.py's
    stand-ins for its three proprietary ops, inputs and parameters (drawn, as the test draws them, from
    the shapes real Caffe2 gives the arrays beside each parameter: the real-Caffe2 venv is needed)."""
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "tests"), str(root / "tests" / "programs")]
    import test_dper_net as dper
    from google.protobuf import text_format

    from rnn2jax.checking.oracle import Caffe2Oracle
    from rnn2jax.ir.loader import load

    if not dper.NET.exists():
        raise SystemExit(f"the dper net is absent ({dper.NET})")
    caffe2_python = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", root / ".venv-caffe2" / "bin" / "python"))
    if not caffe2_python.exists():
        raise SystemExit(f"the dper case draws its parameters with real Caffe2: {caffe2_python} is missing")
    net_proto = text_format.Parse(dper.NET.read_text(), pb.NetDef())
    net = load(net_proto)
    inputs = dper.feature_inputs(np.random.default_rng(0), 5)
    caffe2 = Caffe2Oracle(caffe2_python)
    try:
        tokens = caffe2.python_ops(dper.CAFFE2_STAND_INS)
        params = dper.parameters(caffe2, net, dper.caffe2_net(net_proto, tokens), inputs, 0)
    finally:
        caffe2.close()
    written = [name for op in net.ops for name in op.outputs if not name.endswith("step_workspaces")]
    outputs = list(dict.fromkeys(written))

    def prepare():
        return rnn2jax.compile(net, params=params, outputs=outputs, custom_ops=dper.STAND_INS)

    def example(compiled):
        return _jitted(compiled, inputs)  # the kernels were built by compile(), stand-ins included

    return prepare, example


# --------------------------------------------------------------------------------------------------
# Timing


def compile_once(case: Case) -> dict[str, float]:
    """One fresh compilation of a case, stage by stage (seconds)."""
    prepare, example = case
    jax.clear_caches()
    times = {}
    start = time.perf_counter()
    compiled = prepare()
    times["prepare"] = time.perf_counter() - start
    fn, args = example(compiled)
    start = time.perf_counter()
    traced = fn.trace(*args)
    times["trace"] = time.perf_counter() - start
    start = time.perf_counter()
    lowered = traced.lower()
    times["lower"] = time.perf_counter() - start
    start = time.perf_counter()
    lowered.compile()
    times["xla"] = time.perf_counter() - start
    times["total"] = sum(times.values())
    return times


def cases() -> dict[str, Case]:
    only = set(ARGS.only.split(","))
    short, long = (int(t) for t in ARGS.lengths.split(","))
    table: dict[str, Callable[[], Case]] = {}
    if "dper" in only:
        table["dper/forward"] = dper_case
    if "seq2seq" in only:
        table["seq2seq/forward"] = lambda: seq2seq_case(False)
        table["seq2seq/train"] = lambda: seq2seq_case(True)
    if "lstm" in only:
        for training in (False, True):
            for steps in (short, long):
                table[f"lstm/{'train' if training else 'forward'}/T={steps}"] = lambda s=steps, t=training: lstm_case(
                    s, t
                )
    return {name: make() for name, make in table.items()}


def main() -> None:
    table = cases()
    if ARGS.profile:
        import cProfile
        import pstats

        compile_once(table[ARGS.profile])  # warm imports
        profiler = cProfile.Profile()
        profiler.enable()
        compile_once(table[ARGS.profile])
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        return
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in table}
    for case in table.values():  # one warm-up compilation each: imports and first-use costs
        compile_once(case)
    for _ in range(ARGS.repeats):  # interleaved, so noise from other processes spreads over all cases
        for name, case in table.items():
            runs[name].append(compile_once(case))
    print(
        f"jax {jax.__version__}, {ARGS.threads} XLA threads, H={ARGS.hidden}, N={ARGS.batch}, "
        f"medians of {ARGS.repeats} fresh compilations (s)"
    )
    stages = ("prepare", "trace", "lower", "xla", "total")
    print(f"{'net':<24}" + "".join(f"{s:>9}" for s in stages) + "  target")
    failed = False
    medians = {}
    for name, samples in runs.items():
        medians[name] = {s: statistics.median(r[s] for r in samples) for s in stages}
        verdict = ""
        if not name.startswith("lstm/"):
            ok = medians[name]["total"] < LIMIT_S
            failed |= not ok
            verdict = f"{'pass' if ok else 'FAIL'} (< {LIMIT_S:g} s)"
        print(f"{name:<24}" + "".join(f"{medians[name][s]:9.3f}" for s in stages) + f"  {verdict}")
    short, long = (int(t) for t in ARGS.lengths.split(","))
    for kind in ("forward", "train"):
        a, b = f"lstm/{kind}/T={short}", f"lstm/{kind}/T={long}"
        if a in runs and b in runs:
            ratio = statistics.median(y["total"] / x["total"] for x, y in zip(runs[a], runs[b], strict=True))
            ok = ratio <= FLAT_RATIO
            failed |= not ok
            print(
                f"lstm {kind}: T={long} / T={short} total compile time (median of per-run ratios) "
                f"{ratio:.3f}  {'pass' if ok else 'FAIL'} (<= {FLAT_RATIO:g})"
            )
    print("all targets met" if not failed else "some targets FAILED")


if __name__ == "__main__":
    main()
