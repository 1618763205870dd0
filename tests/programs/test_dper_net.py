"""The real dper ads-ranking train net (176 ops, two LSTM pools, convs, sparse lookups) compiled whole.

Three of its op types are proprietary (SigridTransforms, PriorCorrectionCalibration{Accumulate,Prediction}):
nobody but their owner can supply them, so the test gives simple stand-ins, registered in rnn2jax as user
ops and in real Caffe2 as Python ops (`core.Net.Python`'s mechanism) computing the same thing. Inputs are
random but plausible (id lists, float features, lengths); parameters are drawn with shapes that fit the
net (found by running it op by op). Every blob the net computes is then compared with real Caffe2's.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from google.protobuf import text_format

import rnn2jax
from differential import assert_blob_equal
from rnn2jax.ir.loader import load
from rnn2jax.proto import caffe2_pb2 as pb

NET = Path(__file__).resolve().parents[3] / "shared" / "realnets" / "dper_train_net_lstm_pooling.pbtxt"
pytestmark = pytest.mark.skipif(not NET.exists(), reason=f"the real nets folder is absent ({NET.parent})")

ROWS = 40  # rows of every embedding table; the SigridTransforms stand-in hashes ids into them
HIDDEN = 32  # the LSTM pools' hidden size (the net reshapes their last hidden state to [-1, 32])
FLOAT_KEYS = (1269, 51, 164, 915)  # SparseToDenseMask's mask for the float features
ID_KEYS = (98, 38, 100, 19, 9, 30)  # ... and for the id-list features
SLOTS_PER_TRANSFORM = 3  # each SigridTransforms op emits (range, values) for three id-list features

# --------------------------------------------------------------------------------------------------
# The stand-ins: the same maths in jax.numpy (rnn2jax user ops) and in NumPy (Caffe2 Python ops)


def _sigrid_transforms(op):
    """(instance, ranges [N, 6, 2], values, float features) -> (range, values) per slot: the slots of
    transform `instance` (0 or 1), each a [N, 1, 2] range over the id values hashed into ROWS."""

    def kernel(instance, ranges, values, _floats):
        first = int(np.asarray(instance).reshape(-1)[0]) * SLOTS_PER_TRANSFORM
        hashed = jnp.asarray(values) % ROWS
        outs = []
        for slot in range(first, first + SLOTS_PER_TRANSFORM):
            outs += [jnp.asarray(ranges)[:, slot : slot + 1, :], hashed]
        return tuple(outs)

    return kernel


def _accumulate(op):
    """(beta, gamma, label, weight) -> (beta + sum(label * weight), gamma + sum(weight))."""
    return lambda beta, gamma, label, weight: (
        beta + jnp.sum(label.astype(jnp.float32) * weight),
        gamma + jnp.sum(weight),
    )


def _prediction(op):
    """(beta, gamma, p) -> p * beta / gamma."""
    return lambda beta, gamma, p: p * (beta / gamma)


STAND_INS = [
    rnn2jax.custom_op("SigridTransforms", _sigrid_transforms, inputs=4, outputs=6, static_inputs=(0,)),
    rnn2jax.custom_op("PriorCorrectionCalibrationAccumulate", _accumulate, inputs=4, outputs=2),
    rnn2jax.custom_op("PriorCorrectionCalibrationPrediction", _prediction, inputs=3, outputs=1),
]

CAFFE2_STAND_INS = {
    "SigridTransforms": f"""
def SigridTransforms(inputs, outputs):
    first = int(inputs[0].data.reshape(-1)[0]) * {SLOTS_PER_TRANSFORM}
    ranges, values = inputs[1].data, inputs[2].data
    for k, slot in enumerate(range(first, first + {SLOTS_PER_TRANSFORM})):
        outputs[2 * k].feed(np.ascontiguousarray(ranges[:, slot:slot + 1, :]))
        outputs[2 * k + 1].feed(values % {ROWS})
""",
    "PriorCorrectionCalibrationAccumulate": """
def PriorCorrectionCalibrationAccumulate(inputs, outputs):
    beta, gamma, label, weight = (t.data for t in inputs)
    outputs[0].feed((beta + np.sum(label.astype(np.float32) * weight, dtype=np.float32)).astype(np.float32))
    outputs[1].feed((gamma + np.sum(weight, dtype=np.float32)).astype(np.float32))
""",
    "PriorCorrectionCalibrationPrediction": """
def PriorCorrectionCalibrationPrediction(inputs, outputs):
    beta, gamma, p = (t.data for t in inputs)
    outputs[0].feed((p * (beta / gamma)).astype(np.float32))
""",
}


# --------------------------------------------------------------------------------------------------
# Plausible inputs, and parameters shaped to fit


def feature_inputs(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    """A batch of examples as dper's readers produced them: float features and id lists by key."""
    f_keys, f_values, f_lengths = [], [], []
    for _ in range(batch):
        keys = [k for k in FLOAT_KEYS if rng.random() < 0.8] + [7]  # key 7 is not in the mask: ignored
        f_lengths.append(len(keys))
        for key in keys:
            f_keys.append(key)
            # 164 feeds a Logit (a probability), 915 a BatchOneHot over values 0..2 (a category)
            f_values.append(
                rng.uniform(0.05, 0.95) if key == 164 else rng.integers(0, 3) if key == 915 else rng.normal()
            )
    i_keys, i_lengths, list_lengths, ids = [], [], [], []
    for _ in range(batch):
        # every example has every id list, in any order: the sorted-segment pools refuse an empty one
        # (segment ids with gaps), as Caffe2 does, so dper's readers never produced one
        keys = list(rng.permutation(ID_KEYS))
        i_lengths.append(len(keys))
        for key in keys:
            n = int(rng.integers(1, 5))
            i_keys.append(key)
            list_lengths.append(n)
            ids.extend(rng.integers(0, 10_000, size=n))
    return {
        "float_features:values:keys": np.array(f_keys, np.int64),
        "float_features:values:values": np.array(f_values, np.float32),
        "float_features:lengths": np.array(f_lengths, np.int32),
        "ZERO": np.array(0.0, np.float32),
        "id_list_features:values:keys": np.array(i_keys, np.int64),
        "id_list_features:lengths": np.array(i_lengths, np.int32),
        "id_list_features:values:values:lengths": np.array(list_lengths, np.int32),
        "id_list_features:values:values:values": np.array(ids, np.int64),
        "ZERO_RANGE": np.zeros(2, np.int32),
        # the float features' processing groups: columns [0, 2) as they are, [2, 3) through Logit,
        # [3, 4) one-hot over the values 0, 1, 2
        "feature_preproc/feature_proc_group_0_starts": np.array([0, 0], np.int32),
        "feature_preproc/feature_proc_group_0_ends": np.array([-1, 2], np.int32),
        "feature_preproc/feature_proc_group_1_starts": np.array([0, 2], np.int32),
        "feature_preproc/feature_proc_group_1_ends": np.array([-1, 3], np.int32),
        "feature_preproc/feature_proc_group_2_starts": np.array([0, 3], np.int32),
        "feature_preproc/feature_proc_group_2_ends": np.array([-1, 4], np.int32),
        "feature_preproc/feature_proc_group_2_one_hot_lens": np.array([3], np.int32),
        "feature_preproc/feature_proc_group_2_one_hot_vals": np.array([0, 1, 2], np.int64),
        "feature_preproc/feature_proc_shift_blob": rng.normal(size=6).astype(np.float32),
        "feature_preproc/feature_proc_scale_blob": rng.uniform(0.5, 2, size=6).astype(np.float32),
        "feature_preproc/sigrid_transform_transform_instance": np.array([0], np.int32),
        "feature_preproc/sigrid_transform_auto_0_transform_instance": np.array([1], np.int32),
        "label": rng.integers(0, 2, size=batch).astype(np.float32),
        "weight": rng.uniform(0.5, 1.5, size=batch).astype(np.float32),
    }


def _fc_width(name: str) -> int:
    """Output widths: the LSTM input projection gives 4 gates; pooled features meet in a [N, 20, 32]
    pairwise dot product; then two hidden layers and the logit."""
    if name.endswith("lstm/i2h_w"):
        return 4 * HIDDEN
    if name.startswith("dot/"):
        return HIDDEN
    return {"nested/dense/fc/w": 16, "over/fc/w": 16, "over/fc_auto_0/w": 8, "fc/w": 1}[name]


def _parameter(rng: np.random.Generator, op, position: int, env: dict) -> np.ndarray:
    """A parameter read by `op` at input `position`, shaped from the arrays the op reads beside it."""
    name = op.inputs[position]
    normal = lambda *shape: (rng.normal(size=shape) * 0.3).astype(np.float32)  # noqa: E731
    if op.type in ("Gather", "SparseLengthsSum") and position == 0:  # an embedding table
        return normal(ROWS, 64 if op.type == "SparseLengthsSum" else 16)  # SLS outputs are split in two
    if op.type == "FC":
        width, fan_in = _fc_width(op.inputs[1]), env[op.inputs[0]].shape[-1]
        return normal(width, fan_in) if position == 1 else normal(width)
    if op.type == "RecurrentNetwork":
        return {1: normal(HIDDEN), 2: normal(HIDDEN), 3: normal(4 * HIDDEN, HIDDEN), 4: normal(4 * HIDDEN)}[position]
    if op.type == "Conv":  # NHWC: [M, kernel_h, kernel_w, C]
        kernel_w = op.int("kernel_w")
        return normal(16, 1, kernel_w, env[op.inputs[0]].shape[-1]) if position == 1 else normal(16)
    if op.type == "BatchGather":  # the pairs i < j of the [n, n] similarities, flattened
        n = round(float(np.sqrt(env[op.inputs[0]].shape[1])))
        return np.array([i * n + j for i in range(n) for j in range(i + 1, n)], np.int32)
    if name == "calibration/beta":
        return np.array([0.5], np.float32)
    if name == "calibration/gamma":
        return np.array([1.0], np.float32)
    raise AssertionError(f"no rule for parameter '{name}' of {op.where}")


def parameters(caffe2, net, caffe2_proto: pb.NetDef, inputs: dict, seed: int) -> dict[str, np.ndarray]:
    """Draw each parameter when the first op reads it, shaped from the arrays beside it. Those arrays come
    from real Caffe2 running the net up to that op (one request per op that reads a new parameter, in one
    workspace): running the ~180 ops eagerly in rnn2jax instead cost one XLA compilation per primitive
    (~400, three quarters of the test's time), and the values are compared blob by blob below anyway."""
    rng = np.random.default_rng(seed)
    known, params, done = set(inputs), {}, 0
    feeds, reset = dict(inputs), True
    for position, op in enumerate(net.ops):
        missing = [name for name in op.inputs if name not in known]
        if missing:
            beside = [name for name in dict.fromkeys(op.inputs) if name in known]
            env = caffe2.run(
                [("ops", list(caffe2_proto.op[done:position]))], feeds, beside, workspace="dper", reset=reset
            )
            feeds, reset, done = {}, False, position
            for i, name in enumerate(op.inputs):
                if name not in known:
                    env[name] = params[name] = feeds[name] = _parameter(rng, op, i, env)
                    known.add(name)
        known.update(op.outputs)
    return params


# --------------------------------------------------------------------------------------------------
# The test


def caffe2_net(net_proto: pb.NetDef, tokens: dict[str, str]) -> pb.NetDef:
    """The same net with the proprietary ops as Caffe2 Python ops running the NumPy stand-ins."""
    copy = pb.NetDef()
    copy.CopyFrom(net_proto)
    for op in copy.op:
        if op.type in tokens:
            token = tokens[op.type]
            op.type = "Python"
            op.arg.add(name="token", s=token.encode())
    return copy


def test_dper_net_compiles_whole_and_agrees_with_caffe2(caffe2, seed=0, batch=5):
    net_proto = text_format.Parse(NET.read_text(), pb.NetDef())
    net = load(net_proto)
    inputs = feature_inputs(np.random.default_rng(seed), batch)
    tokens = caffe2.python_ops(CAFFE2_STAND_INS)
    params = parameters(caffe2, net, caffe2_net(net_proto, tokens), inputs, seed)
    written = [name for op in net.ops for name in op.outputs if not name.endswith("step_workspaces")]
    compiled = rnn2jax.compile(net, params=params, outputs=list(dict.fromkeys(written)), custom_ops=STAND_INS)
    got = compiled(inputs)
    assert compiled.specialisations == 1
    # float32 work stays float32 in rnn2jax's 64-bit scope: no float64 anywhere in the program (its int64 ids
    # are int64, as in Caffe2, and compared below with their dtypes)
    assert not re.search(r"[<x]f64>", compiled.lower(inputs).as_text())

    want = caffe2.run([("net", caffe2_net(net_proto, tokens))], {**inputs, **params}, fetch=list(got))
    assert set(want) == set(got)
    for name in want:  # every blob, the sparse preprocessing, pools, LSTMs and convs included
        assert_blob_equal(name, np.asarray(got[name]), want[name])
    # the net did real work: ids were looked up, LSTM pools ran over several steps
    lengths = want[
        "feature_preproc/output_features:SPARSE_AD_CROW_TITLE_HASHES_AUTO_FIRST_X_AUTO_UNIGRAM_AUTO_ADD_BIAS:lengths"
    ]
    assert lengths.sum() > batch and np.isfinite(want["calibration/prediction"]).all()
