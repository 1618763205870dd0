"""Caffe2's `rnn_cell`: RNN cells, the `LSTM`/`BasicRNN`/`MILSTM`/`LayerNorm*` builders, and the attention
cells and `LSTMWithAttention` (over attention.py's computations).

A cell adds its per-step ops to a step model; `apply_over_sequence` prepares the input in the main net
(the `<scope>/i2h` FC), builds the step net and wraps it with `recurrent_net` (section 3.0 of
SEMANTICS.md). Blob names follow Caffe2's exactly, including its scoping quirks: `LSTMCell`,
`BasicRNNCell` run under `NameScope(name)` (unscoped names like 'gates_t'), while MILSTM and the
LayerNorm cells name blobs `name + '/...'` themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import brew
from .attention import (
    AttentionType,
    apply_dot_attention,
    apply_recurrent_attention,
    apply_regular_attention,
    apply_soft_coverage_attention,
)
from .core import BlobReference, ScopedBlobReference
from .model_helper import ModelHelper
from .modeling.initializers import Initializer  # noqa: F401  (Caffe2 scripts reach it as rnn_cell.Initializer)
from .recurrent import recurrent_net
from .scope import NameScope

ExtraInputs = Sequence[tuple[str, int]] | None


def _rectify(blob: str | None) -> BlobReference | None:
    """`rnn_cell._RectifyName`: resolve a plain name in the current scope before entering another."""
    if blob is None or isinstance(blob, BlobReference):
        return blob
    return ScopedBlobReference(blob)


class RNNCell:
    """Base cell: subclasses define `apply_override` (or `_apply`), `get_state_names`, `prepare_input`."""

    def __init__(self, name: str | None = None, forward_only: bool = False, initializer: Any = None):
        self.name = name
        self.recompute_blobs: list[str] = []
        self.forward_only = forward_only
        self.initializer = initializer

    def scope(self, name: str) -> str:
        return self.name + "/" + name if self.name is not None else name

    def apply_over_sequence(
        self,
        model: ModelHelper,
        inputs: str,
        seq_lengths: str | None = None,
        initial_states: Sequence[str] | None = None,
        outputs_with_grads: Sequence[int] | None = None,
    ) -> tuple[BlobReference, list[BlobReference]]:
        """Run the cell over a `T x N x D` sequence: (primary output sequence, all state outputs)."""
        if initial_states is None:
            with NameScope(self.name):
                if self.initializer is None:
                    raise ValueError("Either initial states or initializer have to be set")
                initial_states = self.initializer.create_states(model)
        preprocessed = self.prepare_input(model, inputs)
        step_model = ModelHelper(name=self.name, param_model=model)
        input_t, timestep = step_model.net.AddScopedExternalInputs("input_t", "timestep")
        if len(initial_states) != len(self.get_state_names()):
            raise ValueError("Number of initial state values provided doesn't match the number of states")
        states_prev = step_model.net.AddScopedExternalInputs(*[s + "_prev" for s in self.get_state_names()])
        states = self._apply(step_model, input_t, seq_lengths, states_prev, timestep)
        external_outputs = set(step_model.net.Proto().external_output)
        for state in states:
            if state not in external_outputs:
                step_model.net.AddExternalOutputs(state)
        if outputs_with_grads is None:
            outputs_with_grads = [self.get_output_state_index() * 2]
        states_for_all_steps = recurrent_net(
            net=model.net,
            cell_net=step_model.net,
            inputs=[(input_t, preprocessed)],
            initial_cell_inputs=list(zip(states_prev, initial_states, strict=True)),
            links=dict(zip(states_prev, states, strict=True)),
            timestep=timestep,
            scope=self.name,
            forward_only=self.forward_only,
            outputs_with_grads=outputs_with_grads,
            recompute_blobs_on_backward=self.recompute_blobs,
        )
        return self._prepare_output_sequence(model, states_for_all_steps), states_for_all_steps

    def apply(
        self, model: ModelHelper, input_t: str, seq_lengths: str | None, states: Sequence[str], timestep: str
    ) -> tuple[BlobReference, Sequence[BlobReference]]:
        """One step of the cell, built into `model` (a decoder's step net): (output, new states)."""
        input_t = self.prepare_input(model, input_t)
        states = self._apply(model, input_t, seq_lengths, states, timestep)
        return self._prepare_output(model, states), states

    def _apply(
        self,
        model: ModelHelper,
        input_t: str,
        seq_lengths: str | None,
        states: Sequence[str],
        timestep: str,
        extra_inputs: ExtraInputs = None,
    ) -> Sequence[BlobReference]:
        """Inputs resolved in the caller's scope, then `apply_override` under `NameScope(name)`."""
        input_t, seq_lengths, timestep = _rectify(input_t), _rectify(seq_lengths), _rectify(timestep)
        states = [_rectify(s) for s in states]
        with NameScope(self.name):
            return self.apply_override(model, input_t, seq_lengths, states, timestep, extra_inputs)

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        raise NotImplementedError("Abstract method")

    def prepare_input(self, model: ModelHelper, input_blob: str) -> str:
        return input_blob

    def get_output_state_index(self) -> int:
        return 0

    def get_state_names(self) -> Sequence[str]:
        return [self.scope(n) for n in self.get_state_names_override()]

    def get_state_names_override(self) -> Sequence[str]:
        raise NotImplementedError("Abstract method")

    def _prepare_output(self, model: ModelHelper, states: Sequence[str]) -> str:
        return states[self.get_output_state_index()]

    def _prepare_output_sequence(self, model: ModelHelper, state_outputs: Sequence[str]) -> str:
        return state_outputs[2 * self.get_output_state_index()]


class LSTMInitializer:
    """Initial states as parameters `initial_hidden_state`, `initial_cell_state` (`[H]`, zeros)."""

    def __init__(self, hidden_size: int):
        self.hidden_size = hidden_size

    def create_states(self, model: ModelHelper) -> list[BlobReference]:
        fill = ("ConstantFill", {"value": 0.0})
        return [
            model.create_param("initial_hidden_state", [self.hidden_size], fill),
            model.create_param("initial_cell_state", [self.hidden_size], fill),
        ]


class BasicRNNCell(RNNCell):
    """`h' = act(FC(h) + x_t)`; with seq_lengths, padded steps keep (or drop) the previous state."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        forget_bias: float,
        memory_optimization: bool,
        drop_states: bool = False,
        initializer: Any = None,
        activation: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.drop_states = drop_states
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.activation = activation
        if activation not in ("relu", "tanh"):
            raise ValueError(f"BasicRNNCell with unknown activation function ({activation})")

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev = states[0]
        gates_t = brew.fc(model, hidden_t_prev, "gates_t", dim_in=self.hidden_size, dim_out=self.hidden_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        activation = model.net.Tanh if self.activation == "tanh" else model.net.Relu
        hidden_t = activation(gates_t, "hidden_t")
        if seq_lengths is not None:
            timestep = model.net.CopyFromCPUInput(timestep, "timestep_gpu")
            valid_b = model.net.GT([seq_lengths, timestep], "valid_b", broadcast=1)
            invalid_b = model.net.LE([seq_lengths, timestep], "invalid_b", broadcast=1)
            valid = model.net.Cast(valid_b, "valid", to="float")
            invalid = model.net.Cast(invalid_b, "invalid", to="float")
            hidden_valid = model.net.Mul([hidden_t, valid], "hidden_valid", broadcast=1, axis=1)
            if self.drop_states:
                hidden_t = hidden_valid
            else:
                hidden_invalid = model.net.Mul([hidden_t_prev, invalid], "hidden_invalid", broadcast=1, axis=1)
                hidden_t = model.net.Add([hidden_valid, hidden_invalid], hidden_t)
        return (hidden_t,)

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size, dim_out=self.hidden_size, axis=2)

    def get_state_names(self):
        return (self.scope("hidden_t"),)

    def get_output_dim(self) -> int:
        return self.hidden_size


class LSTMCell(RNNCell):
    """`gates = FC(h_prev) + x_t` (in place), then `LSTMUnit` -> (`hidden_state`, `cell_state`)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        forget_bias: float,
        memory_optimization: bool,
        drop_states: bool = False,
        initializer: Any = None,
        **kwargs: Any,
    ):
        super().__init__(initializer=initializer, **kwargs)
        self.initializer = initializer or LSTMInitializer(hidden_size=hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.forget_bias = float(forget_bias)
        self.memory_optimization = memory_optimization
        self.drop_states = drop_states
        self.gates_size = 4 * hidden_size

    def _gates_input(self, model, hidden_t_prev, extra_inputs, concat_name):
        """The FC input: h_prev, or `Concat(h_prev, extra inputs; axis=2)` (attention context)."""
        if extra_inputs is None:
            return hidden_t_prev, self.hidden_size
        blobs, sizes = zip(*extra_inputs, strict=True)
        concat = brew.concat(model, [hidden_t_prev, *blobs], concat_name, axis=2)
        return concat, self.hidden_size + sum(sizes)

    def apply_override(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = self._gates_input(model, hidden_t_prev, extra_inputs, "gates_concatenated_input_t")
        gates_t = brew.fc(model, fc_input, "gates_t", dim_in=fc_input_dim, dim_out=self.gates_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        if seq_lengths is not None:
            inputs = [hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep]
        else:
            inputs = [hidden_t_prev, cell_t_prev, gates_t, timestep]
        hidden_t, cell_t = model.net.LSTMUnit(
            inputs,
            ["hidden_state", "cell_state"],
            forget_bias=self.forget_bias,
            drop_states=self.drop_states,
            sequence_lengths=seq_lengths is not None,
        )
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_input_params(self) -> dict[str, str]:
        return {"weights": self.scope("i2h") + "_w", "biases": self.scope("i2h") + "_b"}

    def get_recurrent_params(self) -> dict[str, str]:
        return {"weights": self.scope("gates_t") + "_w", "biases": self.scope("gates_t") + "_b"}

    def prepare_input(self, model, input_blob):
        return brew.fc(model, input_blob, self.scope("i2h"), dim_in=self.input_size, dim_out=self.gates_size, axis=2)

    def get_state_names_override(self):
        return ["hidden_t", "cell_t"]

    def get_output_dim(self) -> int:
        return self.hidden_size


class LayerNormLSTMCell(LSTMCell):
    """LSTMCell with `brew.layer_norm(axis=-1)` on the gates; outputs `hidden_t`, `cell_t`.

    No `sequence_lengths` argument on LSTMUnit (default true): it needs seq_lengths.
    """

    # Caffe2's LayerNormLSTMCell derives from RNNCell, not LSTMCell: no recurrent-parameter dictionary,
    # so `return_params=True` fails (AttributeError) as it did there
    get_recurrent_params = None  # type: ignore[assignment]

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = self._gates_input(
            model, hidden_t_prev, extra_inputs, self.scope("gates_concatenated_input_t")
        )
        gates_t = brew.fc(model, fc_input, self.scope("gates_t"), dim_in=fc_input_dim, dim_out=self.gates_size, axis=2)
        brew.sum(model, [gates_t, input_t], gates_t)
        gates_t, _, _ = brew.layer_norm(
            model, self.scope("gates_t"), self.scope("gates_t_norm"), dim_in=self.gates_size, axis=-1
        )
        hidden_t, cell_t = model.net.LSTMUnit(
            [hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep],
            list(self.get_state_names()),
            forget_bias=self.forget_bias,
            drop_states=self.drop_states,
        )
        model.net.AddExternalOutputs(hidden_t, cell_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t

    def get_state_names(self):
        return (self.scope("hidden_t"), self.scope("cell_t"))


class MILSTMCell(LSTMCell):
    """Multiplicative-integration LSTM: `gates = (alpha*x + beta1)*FC(h) + (beta2*x + b)`."""

    layer_norm = False

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        hidden_t_prev, cell_t_prev = states
        fc_input, fc_input_dim = self._gates_input(
            model, hidden_t_prev, extra_inputs, self.scope("gates_concatenated_input_t")
        )
        prev_t = brew.fc(model, fc_input, self.scope("prev_t"), dim_in=fc_input_dim, dim_out=self.gates_size, axis=2)
        size = [self.gates_size]
        alpha = model.create_param(self.scope("alpha"), size, ("ConstantFill", {"value": 1.0}))
        beta_h = model.create_param(self.scope("beta1"), size, ("ConstantFill", {"value": 1.0}))
        beta_i = model.create_param(self.scope("beta2"), size, ("ConstantFill", {"value": 1.0}))
        b = model.create_param(self.scope("b"), size, ("ConstantFill", {"value": 0.0}))
        alpha_x = model.net.ElementwiseLinear(
            [input_t, alpha, beta_h], self.scope("alpha_by_input_t_plus_beta_h"), axis=2
        )
        alpha_x_prev = model.net.Mul([alpha_x, prev_t], self.scope("alpha_by_input_t_plus_beta_h_by_prev_t"))
        beta_x = model.net.ElementwiseLinear([input_t, beta_i, b], self.scope("beta_i_by_input_t_plus_b"), axis=2)
        gates_t = brew.sum(model, [alpha_x_prev, beta_x], self.scope("gates_t"))
        if self.layer_norm:
            gates_t, _, _ = brew.layer_norm(
                model, self.scope("gates_t"), self.scope("gates_t_norm"), dim_in=self.gates_size, axis=-1
            )
        hidden_t, cell_t = model.net.LSTMUnit(
            [hidden_t_prev, cell_t_prev, gates_t, seq_lengths, timestep],
            [self.scope("hidden_t_intermediate"), self.scope("cell_t")],
            forget_bias=self.forget_bias,
            drop_states=self.drop_states,
        )
        model.net.AddExternalOutputs(cell_t, hidden_t)
        if self.memory_optimization:
            self.recompute_blobs = [gates_t]
        return hidden_t, cell_t


class LayerNormMILSTMCell(MILSTMCell):
    """MILSTMCell with `brew.layer_norm(axis=-1)` on the gates."""

    layer_norm = True


class DropoutCell(RNNCell):
    """Wraps a cell; Dropout on its output (not on the recurrent state). No op when the ratio is
    0/None or the cell is forward-only."""

    def __init__(self, internal_cell: RNNCell, dropout_ratio: float | None = None, use_cudnn: bool = False, **kwargs):
        self.internal_cell = internal_cell
        self.dropout_ratio = dropout_ratio
        if "is_test" not in kwargs:
            raise ValueError("Argument 'is_test' is required")
        self.is_test = kwargs.pop("is_test")
        self.use_cudnn = use_cudnn
        super().__init__(**kwargs)
        self.prepare_input = internal_cell.prepare_input
        self.get_output_state_index = internal_cell.get_output_state_index
        self.get_state_names = internal_cell.get_state_names
        self.get_output_dim = internal_cell.get_output_dim
        self.mask = 0

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        return self.internal_cell._apply(model, input_t, seq_lengths, states, timestep, extra_inputs)

    def _prepare_output(self, model, states):
        output = self.internal_cell._prepare_output(model, states)
        return self._apply_dropout(model, output) if self.dropout_ratio is not None else output

    def _prepare_output_sequence(self, model, state_outputs):
        output = self.internal_cell._prepare_output_sequence(model, state_outputs)
        return self._apply_dropout(model, output) if self.dropout_ratio is not None else output

    def _apply_dropout(self, model, output):
        if self.dropout_ratio and not self.forward_only:
            with NameScope(self.name or ""):
                output = brew.dropout(
                    model,
                    output,
                    str(output) + f"_with_dropout_mask{self.mask}",
                    ratio=float(self.dropout_ratio),
                    is_test=self.is_test,
                    use_cudnn=self.use_cudnn,
                )
                self.mask += 1
        return output


class MultiRNNCellInitializer:
    def __init__(self, cells: Sequence[RNNCell]):
        self.cells = cells

    def create_states(self, model: ModelHelper) -> list[BlobReference]:
        states = []
        for i, cell in enumerate(self.cells):
            if cell.initializer is None:
                raise ValueError("Either initial states or initializer have to be set")
            with NameScope(f"layer_{i}"), NameScope(cell.name):
                states.extend(cell.initializer.create_states(model))
        return states


class MultiRNNCell(RNNCell):
    """Stacked cells under `<name>/layer_<i>/`; layer i>0 prepares its input (FC) inside the step net.

    `residual_output_layers`: layers (>0) whose input is added to their output.
    """

    def __init__(self, cells: Sequence[RNNCell], residual_output_layers: Sequence[int] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.cells = list(cells)
        self.residual_output_layers = list(residual_output_layers or [])
        output_index_per_layer = []
        base_index = 0
        for cell in self.cells:
            output_index_per_layer.append(base_index + cell.get_output_state_index())
            base_index += len(cell.get_state_names())
        self.output_connected_layers: list[int] = []
        self.output_indices: list[int] = []
        for i in range(len(self.cells) - 1):
            if (i + 1) in self.residual_output_layers:
                self.output_connected_layers.append(i)
                self.output_indices.append(output_index_per_layer[i])
            else:
                self.output_connected_layers, self.output_indices = [], []
        self.output_connected_layers.append(len(self.cells) - 1)
        self.output_indices.append(output_index_per_layer[-1])
        self.state_names = [
            f"{self.name}/layer_{i}/{name}" for i, cell in enumerate(self.cells) for name in cell.get_state_names()
        ]
        self.initializer = MultiRNNCellInitializer(self.cells)

    def prepare_input(self, model, input_blob):
        input_blob = _rectify(input_blob)
        with NameScope(self.name or ""):
            return self.cells[0].prepare_input(model, input_blob)

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        input_t, seq_lengths, timestep = _rectify(input_t), _rectify(seq_lengths), _rectify(timestep)
        states = [_rectify(s) for s in states]
        states_per_layer = [len(cell.get_state_names()) for cell in self.cells]
        if len(states) != sum(states_per_layer):
            raise ValueError("wrong number of states for the layers")
        next_states: list[BlobReference] = []
        index = 0
        layer_input = input_t
        for i, cell in enumerate(self.cells):
            with NameScope(self.name), NameScope(f"layer_{i}"):
                layer_states = states[index : index + states_per_layer[i]]
                index += states_per_layer[i]
                prepared = cell.prepare_input(model, layer_input) if i > 0 else layer_input
                layer_next = cell._apply(
                    model, prepared, seq_lengths, layer_states, timestep, None if i > 0 else extra_inputs
                )
                if i != len(self.cells) - 1:
                    layer_output = cell._prepare_output(model, layer_next)
                    if i > 0 and i in self.residual_output_layers:
                        layer_input = brew.sum(model, [layer_output, layer_input], self.scope(f"residual_output_{i}"))
                    else:
                        layer_input = layer_output
                next_states.extend(layer_next)
        return next_states

    def get_state_names(self):
        return self.state_names

    def get_output_state_index(self):
        return sum(len(c.get_state_names()) for c in self.cells[:-1]) + self.cells[-1].get_output_state_index()

    def _connected_outputs(self, model, states, per_state, prepare, name):
        outputs = []
        index = 0
        for i, cell in enumerate(self.cells):
            count = per_state * len(cell.get_state_names())
            if i in self.output_connected_layers:
                outputs.append(getattr(cell, prepare)(model, states[index : index + count]))
            index += count
        return brew.sum(model, outputs, self.scope(name)) if len(outputs) > 1 else outputs[0]

    def _prepare_output(self, model, states):
        return self._connected_outputs(model, states, 1, "_prepare_output", "residual_output")

    def _prepare_output_sequence(self, model, states):
        return self._connected_outputs(model, states, 2, "_prepare_output_sequence", "residual_output_sequence")


class UnrolledCell(RNNCell):
    """Static unrolling: the cell's step ops written out `T` times into the main net, instead of a
    RecurrentNetwork op. Step t runs under name scope `timestep_<t>` with parameter sharing mapping that
    scope away, so every step uses the cell's one set of parameters; its timestep is an int32 `[1]`
    ConstantFill in the init net. Returns the same interleaved `(<state>_all, <state>_last)` outputs as
    the dynamic form: `_all` is a Concat of the per-step states along axis 0, `_last` the last step's.
    Outputs not in `outputs_with_grads` get a `ZeroGradient`, so the backward pass treats them as
    RecurrentNetwork did (no gradient flows in from them).
    """

    def __init__(self, cell: RNNCell, T: int):
        self.T = T
        self.cell = cell

    def apply_over_sequence(
        self,
        model: ModelHelper,
        inputs: str,
        seq_lengths: str | None,
        initial_states: Sequence[str],
        outputs_with_grads: Sequence[int] | None = None,
    ) -> tuple[BlobReference, tuple[BlobReference, ...]]:
        from ..proto import caffe2_pb2
        from .core import DataType, DeviceOption
        from .model_helper import ParameterSharing

        inputs = self.cell.prepare_input(model, inputs)
        split = model.net.Split(inputs, [f"{inputs}_timestep_{t}" for t in range(self.T)], axis=0)
        split_inputs = [split] if self.T == 1 else list(split)
        states = initial_states
        per_step = []
        for t in range(self.T):
            with ParameterSharing({f"timestep_{t}": ""}), NameScope(f"timestep_{t}"):
                timestep = model.param_init_net.ConstantFill(
                    [],
                    "timestep",
                    value=t,
                    shape=[1],
                    dtype=DataType.INT32,
                    device_option=DeviceOption(caffe2_pb2.CPU),
                )
                states = self.cell._apply(
                    model=model, input_t=split_inputs[t], seq_lengths=seq_lengths, states=states, timestep=timestep
                )
            per_step.append(states)
        strip = len("timestep_0/")
        all_states = [
            model.net.Concat(
                list(steps), [str(steps[0])[strip:] + "_concat", str(steps[0])[strip:] + "_concat_info"], axis=0
            )[0]
            for steps in zip(*per_step, strict=True)
        ]
        outputs = tuple(blob for pair in zip(all_states, states, strict=True) for blob in pair)
        for i in sorted(set(range(len(outputs))) - set(outputs_with_grads or ())):
            model.net.ZeroGradient(outputs[i], [])
        return self.cell._prepare_output_sequence(model, outputs), outputs


def _LSTM(
    cell_class: type[RNNCell],
    model: ModelHelper,
    input_blob: str,
    seq_lengths: str | None,
    initial_states: Sequence[str] | None,
    dim_in: int,
    dim_out: int | Sequence[int],
    scope: str | None = None,
    outputs_with_grads: Sequence[int] = (0,),
    return_params: bool = False,
    memory_optimization: bool = False,
    forget_bias: float = 0.0,
    forward_only: bool = False,
    drop_states: bool = False,
    return_last_layer_only: bool = True,
    static_rnn_unroll_size: int | None = None,
    **cell_kwargs: Any,
) -> tuple:
    """`rnn_cell._LSTM`: one cell, or a MultiRNNCell when `dim_out` is a list; returns the
    RecurrentNetwork outputs (h_all, h_last, c_all, c_last for LSTMs) of the last layer, or of all
    layers when `return_last_layer_only` is False, plus a params dict when `return_params`."""
    dims = list(dim_out) if isinstance(dim_out, list | tuple) else [dim_out]
    num_layers = len(dims)
    cells = [
        cell_class(
            input_size=dim_in if i == 0 else dims[i - 1],
            hidden_size=dims[i],
            forget_bias=forget_bias,
            memory_optimization=memory_optimization,
            name=scope if num_layers == 1 else None,
            forward_only=forward_only,
            drop_states=drop_states,
            **cell_kwargs,
        )
        for i in range(num_layers)
    ]
    cell = MultiRNNCell(cells, name=scope, forward_only=forward_only) if num_layers > 1 else cells[0]
    if static_rnn_unroll_size is not None:
        cell = UnrolledCell(cell, static_rnn_unroll_size)
    outputs_with_grads = [4 * (num_layers - 1) + i for i in outputs_with_grads]
    _, result = cell.apply_over_sequence(
        model=model,
        inputs=input_blob,
        seq_lengths=seq_lengths,
        initial_states=initial_states,
        outputs_with_grads=outputs_with_grads,
    )
    if return_last_layer_only:
        result = result[4 * (num_layers - 1) :]
    if return_params:
        for method in ("get_input_params", "get_recurrent_params"):  # Caffe2 failed on the missing one
            if getattr(cell, method, None) is None:
                raise AttributeError(f"'{type(cell).__name__}' object has no attribute '{method}' (return_params)")
        result = [*result, {"input": cell.get_input_params(), "recurrent": cell.get_recurrent_params()}]
    return tuple(result)


def LSTM(
    model: ModelHelper, input_blob: str, seq_lengths: str | None, initial_states, dim_in, dim_out, *args, **kwargs
):
    """`rnn_cell.LSTM` (see `_LSTM`): `<scope>/hidden_state_all`, `_last`, `cell_state_all`, `_last`."""
    return _LSTM(LSTMCell, model, input_blob, seq_lengths, initial_states, dim_in, dim_out, *args, **kwargs)


def BasicRNN(
    model: ModelHelper, input_blob: str, seq_lengths: str | None, initial_states, dim_in, dim_out, *args, **kwargs
):
    """`rnn_cell.BasicRNN`; `activation='tanh'|'relu'` is required. Returns (hidden_t_all, hidden_t_last)."""
    return _LSTM(BasicRNNCell, model, input_blob, seq_lengths, initial_states, dim_in, dim_out, *args, **kwargs)


def MILSTM(model: ModelHelper, input_blob: str, seq_lengths: str, initial_states, dim_in, dim_out, *args, **kwargs):
    """`rnn_cell.MILSTM` (seq_lengths required)."""
    return _LSTM(MILSTMCell, model, input_blob, seq_lengths, initial_states, dim_in, dim_out, *args, **kwargs)


def LayerNormLSTM(
    model: ModelHelper, input_blob: str, seq_lengths: str, initial_states, dim_in, dim_out, *args, **kwargs
):
    """`rnn_cell.LayerNormLSTM` (seq_lengths required)."""
    return _LSTM(LayerNormLSTMCell, model, input_blob, seq_lengths, initial_states, dim_in, dim_out, *args, **kwargs)


def LayerNormMILSTM(
    model: ModelHelper, input_blob: str, seq_lengths: str, initial_states, dim_in, dim_out, *args, **kwargs
):
    """`rnn_cell.LayerNormMILSTM` (seq_lengths required)."""
    return _LSTM(LayerNormMILSTMCell, model, input_blob, seq_lengths, initial_states, dim_in, dim_out, *args, **kwargs)


# ------------------------------------------------------------------------------------------------
# Attention cells (in rnn_cell, as in Caffe2; the attention computations are attention.py's)


class AttentionCell(RNNCell):
    """A decoder cell plus attention; states: decoder states (hidden replaced by
    `<name>/hidden_t_external`), `<name>/attention_weighted_encoder_context_t` (+ `coverage_t`)."""

    def __init__(
        self,
        encoder_output_dim: int,
        encoder_outputs: str,
        encoder_lengths: str | None,
        decoder_cell: RNNCell,
        decoder_state_dim: int,
        attention_type: AttentionType,
        weighted_encoder_outputs: str | None,
        attention_memory_optimization: bool,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if attention_type not in tuple(AttentionType):
            raise ValueError(f"unknown attention type {attention_type}")
        self.encoder_output_dim = encoder_output_dim
        self.encoder_outputs = encoder_outputs
        self.encoder_lengths = encoder_lengths
        self.decoder_cell = decoder_cell
        self.decoder_state_dim = decoder_state_dim
        self.weighted_encoder_outputs = weighted_encoder_outputs
        self.encoder_outputs_transposed = None
        self.attention_type = attention_type
        self.attention_memory_optimization = attention_memory_optimization
        self.coverage_weights = None

    def _apply(self, model, input_t, seq_lengths, states, timestep, extra_inputs=None):
        coverage = self.attention_type == AttentionType.SoftCoverage
        decoder_prev_states = states[:-2] if coverage else states[:-1]
        context_prev = states[-2] if coverage else states[-1]
        if extra_inputs is not None:
            raise ValueError("AttentionCell takes no extra inputs")
        decoder_states = self.decoder_cell._apply(
            model,
            input_t,
            seq_lengths,
            decoder_prev_states,
            timestep,
            extra_inputs=[(context_prev, self.encoder_output_dim)],
        )
        self.hidden_t_intermediate = self.decoder_cell._prepare_output(model, decoder_states)
        common = {
            "model": model,
            "encoder_output_dim": self.encoder_output_dim,
            "encoder_outputs_transposed": self.encoder_outputs_transposed,
            "decoder_hidden_state_t": self.hidden_t_intermediate,
            "decoder_hidden_state_dim": self.decoder_state_dim,
            "scope": self.name,
            "encoder_lengths": self.encoder_lengths,
        }
        weighted = {"weighted_encoder_outputs": self.weighted_encoder_outputs}
        if self.attention_type == AttentionType.Recurrent:
            result = apply_recurrent_attention(
                **common, **weighted, attention_weighted_encoder_context_t_prev=context_prev
            )
        elif self.attention_type == AttentionType.Regular:
            result = apply_regular_attention(**common, **weighted)
        elif self.attention_type == AttentionType.Dot:
            result = apply_dot_attention(**common)
        else:
            result = apply_soft_coverage_attention(
                **common, **weighted, coverage_t_prev=states[-1], coverage_weights=self.coverage_weights
            )
        context, self.attention_weights_3d, attention_blobs = result[:3]
        if self.attention_memory_optimization:
            self.recompute_blobs.extend(attention_blobs)
        output = [*decoder_states, context]
        if coverage:
            output.append(result[3])
        index = self.decoder_cell.get_output_state_index()
        output[index] = model.Copy(output[index], self.scope("hidden_t_external"))
        model.net.AddExternalOutputs(*output)
        return output

    def get_attention_weights(self) -> BlobReference:
        return self.attention_weights_3d

    def prepare_input(self, model, input_blob):
        """Main net: transposed encoder outputs, weighted encoder outputs (not for Dot), decoder i2h."""
        if self.encoder_outputs_transposed is None:
            self.encoder_outputs_transposed = brew.transpose(
                model, self.encoder_outputs, self.scope("encoder_outputs_transposed"), axes=[1, 2, 0]
            )
        if self.weighted_encoder_outputs is None and self.attention_type != AttentionType.Dot:
            self.weighted_encoder_outputs = brew.fc(
                model,
                self.encoder_outputs,
                self.scope("weighted_encoder_outputs"),
                dim_in=self.encoder_output_dim,
                dim_out=self.encoder_output_dim,
                axis=2,
            )
        return self.decoder_cell.prepare_input(model, input_blob)

    def build_initial_coverage(self, model: ModelHelper) -> BlobReference:
        """SoftCoverage: `coverage_weights` FC, and 1-D zeros `[encoder_length]` as initial coverage."""
        self.coverage_weights = brew.fc(
            model,
            self.encoder_outputs,
            self.scope("coverage_weights"),
            dim_in=self.encoder_output_dim,
            dim_out=self.encoder_output_dim,
            axis=2,
        )
        encoder_length = model.net.Slice(model.net.Shape(self.encoder_outputs), starts=[0], ends=[1])
        return model.net.ConstantFill(encoder_length, self.scope("initial_coverage"), value=0.0, input_as_shape=1)

    def get_state_names(self):
        names = list(self.decoder_cell.get_state_names())
        names[self.get_output_state_index()] = self.scope("hidden_t_external")
        names.append(self.scope("attention_weighted_encoder_context_t"))
        if self.attention_type == AttentionType.SoftCoverage:
            names.append(self.scope("coverage_t"))
        return names

    def get_output_dim(self) -> int:
        return self.decoder_state_dim + self.encoder_output_dim

    def get_output_state_index(self) -> int:
        return self.decoder_cell.get_output_state_index()

    def _prepare_output(self, model, states):
        context = states[-2] if self.attention_type == AttentionType.SoftCoverage else states[-1]
        with NameScope(self.name or ""):
            return brew.concat(model, [self.hidden_t_intermediate, context], "states_and_context_combination", axis=2)

    def _prepare_output_sequence(self, model, state_outputs):
        coverage = self.attention_type == AttentionType.SoftCoverage
        decoder_output = self.decoder_cell._prepare_output_sequence(
            model, state_outputs[:-4] if coverage else state_outputs[:-2]
        )
        context_index = 2 * (len(self.get_state_names()) - (2 if coverage else 1))
        with NameScope(self.name or ""):
            return brew.concat(
                model,
                [decoder_output, state_outputs[context_index]],
                "states_and_context_combination",
                axis=2,
            )


class LSTMWithAttentionCell(AttentionCell):
    """AttentionCell over an `LSTMCell` named `<name>/decoder`."""

    def __init__(
        self,
        encoder_output_dim,
        encoder_outputs,
        encoder_lengths,
        decoder_input_dim,
        decoder_state_dim,
        name,
        attention_type,
        weighted_encoder_outputs,
        forget_bias,
        lstm_memory_optimization,
        attention_memory_optimization,
        forward_only=False,
    ):
        decoder_cell = LSTMCell(
            input_size=decoder_input_dim,
            hidden_size=decoder_state_dim,
            forget_bias=forget_bias,
            memory_optimization=lstm_memory_optimization,
            name=f"{name}/decoder",
            forward_only=False,
            drop_states=False,
        )
        super().__init__(
            encoder_output_dim=encoder_output_dim,
            encoder_outputs=encoder_outputs,
            encoder_lengths=encoder_lengths,
            decoder_cell=decoder_cell,
            decoder_state_dim=decoder_state_dim,
            name=name,
            attention_type=attention_type,
            weighted_encoder_outputs=weighted_encoder_outputs,
            attention_memory_optimization=attention_memory_optimization,
            forward_only=forward_only,
        )


def LSTMWithAttention(
    model: ModelHelper,
    decoder_inputs: str,
    decoder_input_lengths: str | None,
    initial_decoder_hidden_state: str,
    initial_decoder_cell_state: str,
    initial_attention_weighted_encoder_context: str,
    encoder_output_dim: int,
    encoder_outputs: str,
    encoder_lengths: str | None,
    decoder_input_dim: int,
    decoder_state_dim: int,
    scope: str,
    attention_type: AttentionType = AttentionType.Regular,
    outputs_with_grads: Sequence[int] = (0, 4),
    weighted_encoder_outputs: str | None = None,
    lstm_memory_optimization: bool = False,
    attention_memory_optimization: bool = False,
    forget_bias: float = 0.0,
    forward_only: bool = False,
) -> list[BlobReference]:
    """`rnn_cell.LSTMWithAttention`: the RecurrentNetwork outputs (`_all`, `_last` for hidden_t_external,
    decoder cell_state, attention context, and coverage for SoftCoverage).

    As in Caffe2, `lstm_memory_optimization` has no effect (it sets the decoder cell's recompute list,
    which is not the one passed to recurrent_net).
    """
    cell = LSTMWithAttentionCell(
        encoder_output_dim=encoder_output_dim,
        encoder_outputs=encoder_outputs,
        encoder_lengths=encoder_lengths,
        decoder_input_dim=decoder_input_dim,
        decoder_state_dim=decoder_state_dim,
        name=scope,
        attention_type=attention_type,
        weighted_encoder_outputs=weighted_encoder_outputs,
        forget_bias=forget_bias,
        lstm_memory_optimization=lstm_memory_optimization,
        attention_memory_optimization=attention_memory_optimization,
        forward_only=forward_only,
    )
    initial_states = [
        initial_decoder_hidden_state,
        initial_decoder_cell_state,
        initial_attention_weighted_encoder_context,
    ]
    if attention_type == AttentionType.SoftCoverage:
        initial_states.append(cell.build_initial_coverage(model))
    _, result = cell.apply_over_sequence(
        model=model,
        inputs=decoder_inputs,
        seq_lengths=decoder_input_lengths,
        initial_states=initial_states,
        outputs_with_grads=outputs_with_grads,
    )
    return result
