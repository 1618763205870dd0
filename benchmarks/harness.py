"""One benchmark case (model x size) and the runnable forms of it that compare.py times and checks.

Every form is a `Runner`: a jitted function with its arguments already on the default JAX device (or a
PyTorch closure), `run()` to time it (blocking until the result is ready), and `result()` to get its
outputs in Caffe2's names for the equality check: the sequence output for forward runners, and
`{parameter or input blob: gradient}` for training runners. The JAX runners also keep `fn` and `args`
so that `fn.lower(*args).compile().memory_analysis()` can report the executable's memory.

Import this after XLA_FLAGS is set (compare.py and memory_probe.py set it first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from models import MODELS, Model, Nets, caffe2_nets, random_params

import rnn2jax
from rnn2jax.compiler.compiled_net import run_init_net


@dataclass
class Case:
    model: Model
    steps: int
    batch: int
    hidden: int
    nets: Nets
    params: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]
    cotangent: np.ndarray
    grad_blobs: list[str]  # parameters and inputs whose gradients are compared, in Caffe2's names

    @property
    def size(self) -> tuple[int, int, int]:
        return (self.steps, self.batch, self.hidden)


def prepare(model_name: str, steps: int, batch: int, hidden: int, seed: int = 0) -> Case:
    """Build the nets, draw parameters, inputs and the upstream gradient (`cotangent`) shared by all."""
    model = MODELS[model_name]()
    nets = caffe2_nets(model, hidden)
    params = random_params(run_init_net(nets.init), hidden, seed)
    rng = np.random.default_rng(seed)
    inputs = model.inputs(steps, batch, hidden, rng)
    out = jax.eval_shape(model.hand_forward, model.hand_params(params), inputs)
    cotangent = rng.standard_normal(out.shape).astype(np.float32)
    grad_blobs = [p for p in sorted(params) if p in nets.grads and p not in model.frozen]
    grad_blobs += list(model.grad_inputs)
    return Case(model, steps, batch, hidden, nets, params, inputs, cotangent, grad_blobs)


@dataclass
class Runner:
    run: Callable[[], Any]
    result: Callable[[], Any]
    fn: Any = None  # the jitted function (JAX runners)
    args: tuple = field(default_factory=tuple)


def _device(tree):
    return jax.device_put(jax.tree.map(jnp.asarray, tree))


def _jax_runner(fn, args, extract: Callable[[Any], Any]) -> Runner:
    return Runner(run=lambda: jax.block_until_ready(fn(*args)), result=lambda: extract(fn(*args)), fn=fn, args=args)


def _split_inputs(case: Case, names) -> tuple[dict, dict]:
    """(inputs whose gradient is taken, the rest), restricted to `names` (a compiled net's inputs)."""
    diff = {k: v for k, v in case.inputs.items() if k in case.model.grad_inputs}
    rest = {k: v for k, v in case.inputs.items() if k not in diff and k in names}
    return diff, rest


# ------------------------------------------------------------------------------------------------
# rnn2jax: the compiled Caffe2 nets


def rnn2jax_forward(case: Case) -> Runner:
    compiled = rnn2jax.compile(case.nets.forward, params=case.params, outputs=[case.nets.output])
    inputs = {k: v for k, v in case.inputs.items() if k in compiled.input_names}
    return _jax_runner(jax.jit(compiled.apply), _device((compiled.params, inputs)), lambda o: o[case.nets.output])


def rnn2jax_backward_step_net(case: Case) -> Runner:
    """The training net (forward, loss, get_backward_pass's ops) compiled with the gradients as outputs."""
    wanted = [case.nets.grads[b] for b in case.grad_blobs]
    compiled = rnn2jax.compile(case.nets.train, params=case.params, outputs=wanted)
    feed = {**case.inputs, "cotangent": case.cotangent}
    inputs = {k: v for k, v in feed.items() if k in compiled.input_names}

    def extract(out):
        return {b: out[case.nets.grads[b]] for b in case.grad_blobs}

    return _jax_runner(jax.jit(compiled.apply), _device((compiled.params, inputs)), extract)


def rnn2jax_jax_grad(case: Case) -> Runner:
    """`jax.grad` of the compiled training model's forward net (loss output), to the parameters and inputs."""
    compiled = rnn2jax.compile(case.nets.train_forward, params=case.params, outputs=["loss"])
    diff, rest = _split_inputs(case, compiled.input_names)
    rest["cotangent"] = case.cotangent

    def loss(params, diff, rest):
        return compiled.apply(params, {**rest, **diff})["loss"]

    def extract(grads):
        by_name = {**grads[0], **grads[1]}
        return {b: by_name[b] for b in case.grad_blobs}

    fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return _jax_runner(fn, _device((compiled.params, diff, rest)), extract)


# ------------------------------------------------------------------------------------------------
# Hand-written JAX


def hand_forward(case: Case) -> Runner:
    hp = case.model.hand_params(case.params)
    return _jax_runner(jax.jit(case.model.hand_forward), _device((hp, case.inputs)), lambda o: o)


def hand_training(case: Case) -> Runner:
    """`jax.grad` of the hand-written forward (pre-transposed parameters); gradients are mapped back to
    Caffe2's layout by the VJP of the (linear) parameter map, outside the timed function."""
    hp = case.model.hand_params(case.params)
    diff, rest = _split_inputs(case, case.inputs)

    def loss(hp, diff, rest, cotangent):
        return jnp.vdot(case.model.hand_forward(hp, {**rest, **diff}), cotangent)

    _, to_caffe2 = jax.vjp(case.model.hand_params, {k: jnp.asarray(v) for k, v in case.params.items()})

    def extract(grads):
        (by_name,) = to_caffe2(grads[0])
        by_name = {**by_name, **grads[1]}
        return {b: by_name[b] for b in case.grad_blobs}

    fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return _jax_runner(fn, _device((hp, diff, rest, case.cotangent)), extract)


# ------------------------------------------------------------------------------------------------
# PyTorch


TORCH_DEVICE = "cpu"  # where PyTorch runs: compare.py's --torch-device ("cuda" beside a JAX GPU)


def _torch_setup(case: Case):
    import torch

    model = case.model
    module = model.torch_module(case.hidden)
    torch_values = model.torch_params({k: jnp.asarray(v) for k, v in case.params.items()})
    with torch.no_grad():
        for name, value in torch_values.items():
            getattr(module, name).copy_(torch.from_numpy(np.array(value)))
    module.to(TORCH_DEVICE)
    tensors = {k: torch.from_numpy(np.array(v)).to(TORCH_DEVICE) for k, v in case.inputs.items()}
    return torch, module, tensors


def _finished(torch) -> None:
    """A CUDA call returns before the GPU is done: time it to the end of its work, as block_until_ready does."""
    if TORCH_DEVICE != "cpu":
        torch.cuda.synchronize()


def _host(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def torch_forward(case: Case) -> Runner | None:
    if case.model.torch_module is None:
        return None
    torch, module, tensors = _torch_setup(case)

    def run():
        with torch.no_grad():
            out = case.model.torch_forward(module, tensors)
        _finished(torch)
        return out

    return Runner(run=run, result=lambda: _host(run()))


def torch_training(case: Case) -> Runner | None:
    """Autograd to the weights and the inputs, with the same upstream gradient as everyone (`cotangent`)."""
    if case.model.torch_module is None:
        return None
    torch, module, tensors = _torch_setup(case)
    for name in case.model.grad_inputs:
        tensors[name].requires_grad_(True)
    cotangent = torch.from_numpy(case.cotangent).to(TORCH_DEVICE)
    names = [name for name, _ in module.named_parameters()]

    def run():
        module.zero_grad(set_to_none=True)
        for name in case.model.grad_inputs:
            tensors[name].grad = None
        case.model.torch_forward(module, tensors).backward(cotangent)
        _finished(torch)

    params_jnp = {k: jnp.asarray(v) for k, v in case.params.items()}
    _, to_caffe2 = jax.vjp(case.model.torch_params, params_jnp)

    def result():
        run()
        torch_grads = {n: jnp.asarray(_host(getattr(module, n).grad)) for n in names}
        (by_name,) = to_caffe2(torch_grads)
        by_name = {**by_name, **{n: _host(tensors[n].grad) for n in case.model.grad_inputs}}
        return {b: by_name[b] for b in case.grad_blobs}

    return Runner(run=run, result=result)


def memory_analysis(runner: Runner) -> dict[str, int] | None:
    """XLA's own accounting of the compiled executable: temp, argument and output buffers (bytes)."""
    stats = runner.fn.lower(*runner.args).compile().memory_analysis()
    if stats is None:
        return None
    out = {
        "temp_bytes": int(stats.temp_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
    }
    out["total_bytes"] = out["temp_bytes"] + out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"]
    return out
