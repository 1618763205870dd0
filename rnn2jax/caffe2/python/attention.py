"""Caffe2's `attention` module: `AttentionType` and the ops each kind of attention adds to a decoder step
(`apply_regular_attention`, ...). As in Caffe2, the cells that call them (`AttentionCell`,
`LSTMWithAttention`) are rnn_cell's, which imports this module, never the reverse.

A decoder LSTM reads `concat(h_prev, context_prev)`; the attention over the encoder uses the *new*
decoder hidden state; the recurrent hidden state is a `Copy` of it (`<scope>/hidden_t_external`).
Encoder-side tensors (transposed outputs, weighted outputs, coverage weights) are computed in the main
net and become references (and, for the backward pass, params) of the RecurrentNetwork op.
"""

from __future__ import annotations

from enum import IntEnum

from . import brew


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
