"""Caffe2's `attention` module and its `AttentionCell` / `LSTMWithAttention` (from rnn_cell).

A decoder LSTM reads `concat(h_prev, context_prev)`; the attention over the encoder uses the *new*
decoder hidden state; the recurrent hidden state is a `Copy` of it (`<scope>/hidden_t_external`).
Encoder-side tensors (transposed outputs, weighted outputs, coverage weights) are computed in the main
net and become references (and, for the backward pass, params) of the RecurrentNetwork op.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from . import brew
from .core import BlobReference
from .model_helper import ModelHelper
from .rnn_cell import LSTMCell, RNNCell
from .scope import NameScope


class AttentionType(IntEnum):
    Regular = 0
    Recurrent = 1
    Dot = 2
    SoftCoverage = 3


def s(scope: str, name: str) -> str:
    return f"{scope}/{name}"


def _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, attention_weights_3d, scope):
    context = brew.batch_mat_mul(
        model,
        [encoder_outputs_transposed, attention_weights_3d],
        s(scope, "attention_weighted_encoder_context"),
    )
    context, _ = model.net.Reshape(
        context,
        [context, s(scope, "attention_weighted_encoder_context_old_shape")],
        shape=[1, -1, encoder_output_dim],
    )
    return context


def _calc_attention_weights(model, attention_logits_transposed, scope, encoder_lengths=None):
    if encoder_lengths is not None:
        attention_logits_transposed = model.net.SequenceMask(
            [attention_logits_transposed, encoder_lengths], ["masked_attention_logits"], mode="sequence"
        )
    return brew.softmax(model, attention_logits_transposed, s(scope, "attention_weights_3d"), engine="CUDNN", axis=1)


def _calc_attention_logits_from_sum_match(model, decoder_hidden_encoder_outputs_sum, encoder_output_dim, scope):
    summed = model.net.Tanh(decoder_hidden_encoder_outputs_sum, decoder_hidden_encoder_outputs_sum)
    logits = brew.fc(
        model,
        summed,
        s(scope, "attention_logits"),
        dim_in=encoder_output_dim,
        dim_out=1,
        axis=2,
        freeze_bias=True,
    )
    return brew.transpose(model, logits, s(scope, "attention_logits_transposed"), axes=[1, 0, 2])


def _apply_fc_weight_for_sum_match(model, blob_in, dim_in, dim_out, scope, name):
    output = brew.fc(model, blob_in, s(scope, name), dim_in=dim_in, dim_out=dim_out, axis=2)
    return model.net.Squeeze(output, output, dims=[0])


def apply_recurrent_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    weighted_encoder_outputs,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    attention_weighted_encoder_context_t_prev,
    scope,
    encoder_lengths=None,
):
    """RecAtt: the previous context also enters the sum-match. Returns (context, weights, recompute)."""
    weighted_prev = _apply_fc_weight_for_sum_match(
        model,
        attention_weighted_encoder_context_t_prev,
        encoder_output_dim,
        encoder_output_dim,
        scope,
        "weighted_prev_attention_context",
    )
    weighted_decoder = _apply_fc_weight_for_sum_match(
        model,
        decoder_hidden_state_t,
        decoder_hidden_state_dim,
        encoder_output_dim,
        scope,
        "weighted_decoder_hidden_state",
    )
    summed_tmp = model.net.Add([weighted_prev, weighted_decoder], s(scope, "decoder_hidden_encoder_outputs_sum_tmp"))
    summed = model.net.Add(
        [weighted_encoder_outputs, summed_tmp], s(scope, "decoder_hidden_encoder_outputs_sum"), broadcast=1
    )
    logits = _calc_attention_logits_from_sum_match(model, summed, encoder_output_dim, scope)
    weights = _calc_attention_weights(model, logits, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    return context, weights, [summed]


def apply_regular_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    weighted_encoder_outputs,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    scope,
    encoder_lengths=None,
):
    """Bahdanau sum-match attention. Returns (context, weights, blobs to recompute)."""
    weighted_decoder = _apply_fc_weight_for_sum_match(
        model,
        decoder_hidden_state_t,
        decoder_hidden_state_dim,
        encoder_output_dim,
        scope,
        "weighted_decoder_hidden_state",
    )
    summed = model.net.Add(
        [weighted_encoder_outputs, weighted_decoder],
        s(scope, "decoder_hidden_encoder_outputs_sum"),
        broadcast=1,
        use_grad_hack=1,
    )
    logits = _calc_attention_logits_from_sum_match(model, summed, encoder_output_dim, scope)
    weights = _calc_attention_weights(model, logits, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    return context, weights, [summed]


def apply_dot_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    scope,
    encoder_lengths=None,
):
    """Dot-product attention (an FC to the encoder size first when the sizes differ)."""
    if decoder_hidden_state_dim != encoder_output_dim:
        weighted_decoder = brew.fc(
            model,
            decoder_hidden_state_t,
            s(scope, "weighted_decoder_hidden_state"),
            dim_in=decoder_hidden_state_dim,
            dim_out=encoder_output_dim,
            axis=2,
        )
    else:
        weighted_decoder = decoder_hidden_state_t
    squeezed = model.net.Squeeze(weighted_decoder, s(scope, "squeezed_weighted_decoder_hidden_state"), dims=[0])
    expanded = model.net.ExpandDims(squeezed, squeezed, dims=[2])
    logits = model.net.BatchMatMul([encoder_outputs_transposed, expanded], s(scope, "attention_logits"), trans_a=1)
    weights = _calc_attention_weights(model, logits, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    return context, weights, []


def apply_soft_coverage_attention(
    model,
    encoder_output_dim,
    encoder_outputs_transposed,
    weighted_encoder_outputs,
    decoder_hidden_state_t,
    decoder_hidden_state_dim,
    scope,
    encoder_lengths,
    coverage_t_prev,
    coverage_weights,
):
    """Regular attention plus accumulated attention ("coverage") weighted into the sum-match."""
    weighted_decoder = _apply_fc_weight_for_sum_match(
        model,
        decoder_hidden_state_t,
        decoder_hidden_state_dim,
        encoder_output_dim,
        scope,
        "weighted_decoder_hidden_state",
    )
    summed_tmp = model.net.Add(
        [weighted_encoder_outputs, weighted_decoder],
        s(scope, "decoder_hidden_encoder_outputs_sum_tmp"),
        broadcast=1,
    )
    coverage_2d = model.net.Squeeze(coverage_t_prev, s(scope, "coverage_t_prev_2d"), dims=[0])
    coverage_transposed = brew.transpose(model, coverage_2d, s(scope, "coverage_t_prev_transposed"))
    scaled = model.net.Mul(
        [coverage_weights, coverage_transposed], s(scope, "scaled_coverage_weights"), broadcast=1, axis=0
    )
    # final Caffe2 sums into a new blob (no broadcast argument): the backward builds, unlike the older
    # in-place `Add([sum, scaled]) -> sum` that core.py's version check rejected
    summed = model.net.Add([summed_tmp, scaled], s(scope, "decoder_hidden_encoder_outputs_sum"))
    logits = _calc_attention_logits_from_sum_match(model, summed, encoder_output_dim, scope)
    weights = _calc_attention_weights(model, logits, scope, encoder_lengths)
    context = _calc_weighted_context(model, encoder_outputs_transposed, encoder_output_dim, weights, scope)
    weights_2d = model.net.Squeeze(weights, s(scope, "attention_weights_2d"), dims=[2])
    coverage_t = model.net.Add([coverage_t_prev, weights_2d], s(scope, "coverage_t"), broadcast=1)
    return context, weights, [summed], coverage_t


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
