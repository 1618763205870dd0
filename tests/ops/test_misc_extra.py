"""rnn2jax/ops/misc_extra.py against real Caffe2.

Lowered ops (the `CASES`): Assert, DataCouple and the stylizer's deprocess, on hypothesis-drawn inputs, and
fbgemm's FbGemmPack, FbGemmPackTranspose and FbFCPacked, each drawn as the pack-then-FC pair a predictor runs
(Caffe2's packed blob can be neither fed nor fetched; float16 weights, float32 sums: equal to float32
rounding). Host ops and nets, each run in both (tests/host_differential.py): Assert failing a workspace's net,
FeedBlob, EstimateAllBlobSizes over tensors of every dtype, strings and blobs no serializer estimates, the
stylizer's preprocess with noise_std=0 (the noise blob is zeros: Caffe2's values exactly) and, by its
properties, with noise (Caffe2 draws from its own generator), and the packed blob made by one net and read
by the next.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from differential import Case, arrays, cases, make_op, run_case, run_rnn2jax, shapes
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import InputTypeError, Rnn2JaxError
from rnn2jax.proto import caffe2_pb2 as pb
from tests.host_differential import check_net, run_rnn2jax_net

# ------------------------------------------------------------------------------------------------
# Lowered ops


def draw_assert(data):
    dtype = data.draw(st.sampled_from([np.int32, np.int64, np.bool_, np.float32]))  # float32: refused
    x = data.draw(arrays(shapes(0, 3, 0, 4), dtype, 0, 3))
    if data.draw(st.booleans()) and x.size:  # mostly true, to pass
        x = np.where(x == 0, np.ones_like(x), x)
    message = data.draw(st.sampled_from(["", "boom {x}"]))
    return make_op("Assert", ["x"], [], error_msg=message), {"x": x}


def draw_data_couple(data):
    count = data.draw(st.integers(1, 3))
    names = [f"x{i}" for i in range(count)]
    dtypes = [np.float32, np.int64, np.int32, np.float16, np.uint8]
    inputs = {name: data.draw(arrays(shapes(0, 3), data.draw(st.sampled_from(dtypes)), 0, 9)) for name in names}
    outputs = names[: data.draw(st.integers(0, count))]  # output i in place on input i; the rest only read
    return make_op("DataCouple", names, outputs), inputs


def draw_deprocess(data):
    n, h, w = data.draw(shapes(3, 3, 1, 4))
    channels = 3 if data.draw(st.integers(0, 7)) else 4  # 4: refused
    x = data.draw(arrays((n, channels, h, w), np.float32, -60, 300))
    mean = data.draw(arrays((3,), np.float32, -20, 120))
    return make_op("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", ["x", "mean"], ["y"]), {"x": x, "mean": mean}


def draw_fbgemm(op_type: str):
    """fbgemm's three ops, each drawn as the pair a predictor runs: a pack op (FbGemmPack, or
    FbGemmPackTranspose) then FbFCPacked reading the packed blob. The packed blob is opaque in Caffe2 (it can be
    neither fed nor fetched), so `check_fbgemm` runs the pair and compares FbFCPacked's output. W is FC's N x K
    (FbGemmPack) or K x N (FbGemmPackTranspose), split at axis_w; X is split at axis; values beyond float16's
    range saturate when packed; about one draw in eight has a mismatched dim (refused by both)."""

    def draw(data):
        transpose = op_type == "FbGemmPackTranspose" or (op_type == "FbFCPacked" and data.draw(st.booleans()))
        m_shape, k_shape = data.draw(shapes(1, 2, 1, 3)), data.draw(shapes(1, 2, 1, 4))
        n, k = data.draw(st.integers(1, 5)), int(np.prod(k_shape))
        w_shape = (*k_shape, n) if transpose else (n, *k_shape)
        axis_w = len(k_shape) if transpose else 1
        weights = data.draw(arrays(w_shape, np.float32, -70000, 70000))
        x = data.draw(arrays((*m_shape, *k_shape), np.float32, -2, 2))
        bias = data.draw(arrays((n + (data.draw(st.integers(0, 7)) == 0),), np.float32, -1, 1))
        pack = make_op("FbGemmPackTranspose" if transpose else "FbGemmPack", ["w"], ["packed"], axis_w=axis_w)
        fc = make_op("FbFCPacked", ["x", "packed", "b"], ["y"], axis=len(m_shape))
        op = fc if op_type == "FbFCPacked" else pack
        return op, {"w": weights, "x": x, "b": bias, "pair": (pack, fc), "k": k}

    return draw


def check_fbgemm(caffe2, case: Case, data) -> None:
    """The drawn pair under rnn2jax.compile (jitted) against Caffe2, equal to float32 rounding (fbgemm sums
    the K products in its own order): |difference| <= 1e-6 (|X| |W16| + 1), per element."""
    op, drawn = case.draw(data)
    assert op.type == case.op_type
    ops, k = list(drawn.pop("pair")), drawn.pop("k")
    try:
        want = caffe2.run([("net", ops_net(ops))], drawn, ["y"])["y"]
    except Caffe2Error:
        with pytest.raises(Rnn2JaxError):
            run_rnn2jax(ops, drawn, ["y"])
        return
    got = run_rnn2jax(ops, drawn, ["y"])["y"]
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    halves = np.clip(drawn["w"], -65504, 65504).astype(np.float16).astype(np.float32).reshape(-1)
    b_matrix = halves.reshape(k, -1) if ops[0].type == "FbGemmPackTranspose" else halves.reshape(-1, k).T
    scale = np.abs(drawn["x"]).reshape(-1, k) @ np.abs(b_matrix) + 1
    n = b_matrix.shape[1]
    assert np.all(np.abs(got - want).reshape(-1, n) <= 1e-6 * scale), (got, want)


FBGEMM = ("FbGemmPack", "FbGemmPackTranspose", "FbFCPacked")

CASES = cases(
    Case("Assert", draw_assert, note="no output; refuses a false element"),
    Case("DataCouple", draw_data_couple),
    Case("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", draw_deprocess),
    *(Case(name, draw_fbgemm(name), note="the pack op and FbFCPacked as a pair") for name in FBGEMM),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@settings(max_examples=10)
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    if case.op_type in FBGEMM:
        check_fbgemm(caffe2, case, data)
    else:
        run_case(caffe2, case, data)


@pytest.mark.parametrize(
    ("x", "fails"),
    [
        (np.array([1, 2], np.int64), False),
        (np.array([[True], [False]]), True),
        (np.array([3, 0, 0], np.int32), True),
        (np.zeros((0,), np.int32), False),
        (np.ones(2, np.float32), True),
    ],
)
def test_assert_fails_a_workspace_net_as_caffe2_does(caffe2, x, fails):
    """In a workspace, Assert fails the net at the op, as in Caffe2: the jitted segment holding it raises its failed
    run-time check after the call."""
    op = make_op("Assert", ["x"], [], error_msg="boom")
    check_net(caffe2, [op], {"x": x}, fails=fails)
    error = run_rnn2jax_net([op], {"x": x})
    if fails and x.dtype != np.float32:
        assert "Assert failed for element 1 in tensor 'x', value: 0" in str(error) and "boom" in str(error)


def test_data_couple_must_be_in_place(caffe2):
    check_net(caffe2, [make_op("DataCouple", ["x"], ["y"])], {"x": np.ones(2, np.float32)}, fails=True)


# ------------------------------------------------------------------------------------------------
# FeedBlob and EstimateAllBlobSizes


def test_feed_blob_writes_a_string_blob(caffe2):
    ops = [make_op("FeedBlob", [], ["s"], value="héllo")]
    want = caffe2.run([("net", ops_net(ops))], {}, ["s"])["s"]
    got = run_rnn2jax_net(ops, {})
    assert not isinstance(got, Rnn2JaxError), got
    assert got.fetch("s") == "héllo".encode() == np.asarray(want).item()
    check_net(caffe2, [make_op("FeedBlob", [], ["s"])], fails=True)


SIZE_FEEDS = {
    "f32": np.ones((2, 3), np.float32),
    "f64": np.ones(3, np.float64),
    "f16": np.ones(5, np.float16),
    "i32": np.arange(4, dtype=np.int32),
    "i64": np.arange(4, dtype=np.int64),
    "u8": np.ones(7, np.uint8),
    "i8": np.ones(7, np.int8),
    "u16": np.ones(2, np.uint16),
    "i16": np.ones(2, np.int16),
    "yes": np.ones(3, np.bool_),
    "empty": np.zeros((0, 3), np.float32),
    "strings": np.array([b"a", b"longer string"], object),
    "big": np.zeros(1_000_001, np.float32),  # two chunks of Caffe2's default 1,000,000
}


def _sizes(names: np.ndarray, sizes: np.ndarray) -> dict[bytes, int]:
    assert sizes.dtype == np.int64 and names.shape == sizes.shape
    return dict(zip(names.tolist(), sizes.tolist(), strict=True))


@pytest.mark.parametrize("with_options", [False, True])
def test_estimate_all_blob_sizes_matches_caffe2(caffe2, with_options):
    """Every dtype's estimate, a string blob, blobs no serializer estimates (a counter, a packed matrix, an
    Int8 tensor: 0), the outputs themselves, and per-blob options (bfloat16 floats, chunk sizes, a regex
    matching the name whole)."""
    args = {}
    if with_options:
        options = pb.SerializationOptions()
        options.options.add(
            blob_name_regex="big", float_format=pb.BlobSerializationOptions.FLOAT_BFLOAT16, chunk_size=500
        )
        options.options.add(blob_name_regex="i.*", chunk_size=3)
        options.options.add(blob_name_regex="f", chunk_size=-1)  # matches no name whole
        args["options"] = options.SerializeToString()
    ops = [
        make_op("FeedBlob", [], ["text"], value="some text"),
        make_op("CreateCounter", [], ["counter"]),
        make_op("FbGemmPack", ["f32"], ["packed"]),  # not a tensor: 0 (Caffe2 has no serializer for it)
        make_op("Int8GivenTensorFill", [], ["q"], shape=[2], values=b"ab", Y_scale=1.0, Y_zero_point=0),
        make_op("EstimateAllBlobSizes", [], ["names", "sizes"], **args),
    ]
    want = caffe2.run([("net", ops_net(ops))], SIZE_FEEDS, ["names", "sizes"])
    got = run_rnn2jax_net(ops, SIZE_FEEDS)
    assert not isinstance(got, Rnn2JaxError), got
    assert _sizes(got.fetch("names"), got.fetch("sizes")) == _sizes(want["names"], want["sizes"])


def ops_net(ops):
    from rnn2jax.caffe2.opdef import create_net

    return create_net("host_ops", list(ops))


def test_estimate_all_blob_sizes_takes_two_outputs():
    error = run_rnn2jax_net([make_op("EstimateAllBlobSizes", [], ["names"])], {})
    assert isinstance(error, Rnn2JaxError) and "2 outputs" in str(error)


# ------------------------------------------------------------------------------------------------
# The stylizer's preprocess (a host op: its noise lives in the workspace)

NOISE = "__CAFFE2_STYLIZER_NOISE__"


@settings(max_examples=8)
@given(
    nhw=shapes(3, 3, 1, 5),
    mean=arrays((3,), np.float32, -50, 150),
    noise_size=st.sampled_from([1, 7, 491]),
    seed=st.integers(0, 2**16),
)
def test_stylizer_preprocess_without_noise_matches_caffe2(caffe2, nhw, mean, noise_size, seed):
    image = np.random.default_rng(seed).integers(0, 256, (*nhw, 4), dtype=np.uint8)
    op = make_op(
        "PackedInt8BGRANHWCToNCHWCStylizerPreprocess", ["x", "mean"], ["y"], noise_std=0.0, noise_size=noise_size
    )
    back = make_op("BRGNCHWCToPackedInt8BGRAStylizerDeprocess", ["y", "mean"], ["z"])
    _, want = check_net(caffe2, [op, back], {"x": image, "mean": mean})
    assert want[NOISE].shape == (noise_size,) and want["y"].shape == (nhw[0], 3, *nhw[1:])


@pytest.mark.parametrize(
    ("feeds", "words"),
    [
        ({"x": np.zeros((1, 2, 2, 3), np.uint8), "mean": np.zeros(3, np.float32)}, "N x H x W x 4"),
        ({"x": np.zeros((1, 2, 2, 4), np.float32), "mean": np.zeros(3, np.float32)}, "uint8"),
        ({"x": np.zeros((1, 2, 2, 4), np.uint8), "mean": np.zeros(4, np.float32)}, "needs 3"),
    ],
)
def test_stylizer_preprocess_refuses_as_caffe2_does(caffe2, feeds, words):
    op = make_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", ["x", "mean"], ["y"], noise_std=0.0)
    check_net(caffe2, [op], feeds, fails=True)
    assert words in str(run_rnn2jax_net([op], feeds))


def test_stylizer_preprocess_noise_is_drawn_once_and_cycles(caffe2):
    """With noise: Caffe2's generator is not ours, so compare properties. Both keep `noise_size` values of
    about N(0, noise_std) in the noise blob, reuse them in later runs (even with another noise_std), and add
    noise[(pixel * 3 + channel) % noise_size] to each image's values."""
    image = np.random.default_rng(0).integers(0, 256, (2, 4, 5, 4), dtype=np.uint8)
    mean = np.array([10, 20, 30], np.float32)
    feeds = {"x": image, "mean": mean}
    ops = [
        make_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", ["x", "mean"], ["y"], noise_std=5.0, noise_size=7),
        make_op("PackedInt8BGRANHWCToNCHWCStylizerPreprocess", ["x", "mean"], ["y2"], noise_std=0.0, noise_size=7),
    ]
    want = caffe2.run([("net", ops_net(ops))], feeds, None)
    got = run_rnn2jax_net(ops, feeds)
    assert not isinstance(got, Rnn2JaxError), got
    ours = {name: np.asarray(got.fetch(name)) for name in ("y", "y2", NOISE)}
    for blobs in (want, ours):
        noise = blobs[NOISE]
        assert noise.shape == (7,) and noise.dtype == np.float32 and np.all(np.abs(noise) < 50) and np.any(noise != 0)
        np.testing.assert_array_equal(blobs["y"], blobs["y2"])  # the second op reused the first's noise
        cycle = noise[np.arange(4 * 5 * 3) % 7].reshape(4, 5, 3)
        expected = (image[..., :3].astype(np.float32) - mean) + cycle
        np.testing.assert_array_equal(blobs["y"], np.transpose(expected, (0, 3, 1, 2)))


# ------------------------------------------------------------------------------------------------
# fbgemm's float16 FC


@settings(max_examples=4)
@given(
    data=st.data(),
    transpose=st.booleans(),
    m_shape=shapes(1, 2, 1, 3),
    k_shape=shapes(1, 2, 1, 4),
    n=st.integers(1, 5),
)
def test_fbgemm_pack_and_fc_match_caffe2(caffe2, data, transpose, m_shape, k_shape, n):
    """W as FC's N x K (FbGemmPack) or K x N (FbGemmPackTranspose), split at axis_w; X split at axis; values
    beyond float16's range saturate when packed. Several outputs from one packed blob, in two nets as a
    predictor runs them (the packed blob made by the first, read by the second)."""
    k = int(np.prod(k_shape))
    weights = data.draw(arrays((k, n) if transpose else (n, k), np.float32, -70000, 70000))
    x = data.draw(arrays((*m_shape, *k_shape), np.float32, -2, 2))
    bias = data.draw(arrays((n,), np.float32, -1, 1))
    pack = "FbGemmPackTranspose" if transpose else "FbGemmPack"
    feeds = {"w": weights, "x": x, "b": bias}
    ops = [
        make_op(pack, ["w"], ["packed"]),
        make_op("FbFCPacked", ["x", "packed", "b"], ["y"], axis=len(m_shape)),
        make_op("FbFCPacked", ["x", "packed", "b"], ["y_again"], axis=len(m_shape)),
    ]
    want = caffe2.run([("net", ops_net(ops[:1])), ("net", ops_net(ops[1:]))], feeds, ["y", "y_again"])
    got = run_rnn2jax_net(ops, feeds)
    assert not isinstance(got, Rnn2JaxError), got
    halves = np.clip(weights, -65504, 65504).astype(np.float16).astype(np.float32)
    scale = np.abs(x).reshape(-1, k) @ np.abs(halves if transpose else halves.T) + 1
    for name in ("y", "y_again"):
        ours = np.asarray(got.fetch(name))
        assert ours.dtype == want[name].dtype == np.float32 and ours.shape == want[name].shape == (*m_shape, n)
        assert np.all(np.abs(ours - want[name]).reshape(-1, n) <= 1e-6 * scale), (ours, want[name])


@pytest.mark.parametrize(
    ("feeds", "error"),
    [
        ({"x": np.ones((2, 5), np.float32), "b": np.ones(4, np.float32)}, "Dimension mismatch"),
        ({"x": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32)}, "Dimension mismatch"),
        ({"x": np.ones((2, 3), np.float64), "b": np.ones(4, np.float32)}, "float32"),
    ],
)
def test_fb_fc_packed_refuses_as_caffe2_does(caffe2, feeds, error):
    ops = [make_op("FbGemmPack", ["w"], ["packed"]), make_op("FbFCPacked", ["x", "packed", "b"], ["y"])]
    feeds = {"w": np.ones((4, 3), np.float32), **feeds}
    check_net(caffe2, ops, feeds, fails=True)
    assert error in str(run_rnn2jax_net(ops, feeds))


def test_fb_fc_packed_refuses_an_unpacked_tensor(caffe2):
    ops = [make_op("FbFCPacked", ["x", "w", "b"], ["y"])]
    feeds = {"x": np.ones((2, 3), np.float32), "w": np.ones((3, 4), np.float16), "b": np.ones(4, np.float32)}
    check_net(caffe2, ops, feeds, fails=True)
    error = run_rnn2jax_net(ops, feeds)
    assert isinstance(error, InputTypeError) and "make one with FbGemmPack" in str(error)


def test_packed_weights_pass_through_compiled_nets_and_the_workspace(tmp_path):
    """A packed blob fed to a compiled net or a workspace (a predictor's init net made it) is read as it is;
    Save refuses it by name, as Caffe2 has no serializer for it."""
    import rnn2jax
    from rnn2jax.caffe2.opdef import create_net
    from rnn2jax.errors import StorageError
    from rnn2jax.ir.packed import PackedFP16Matrix

    packed = PackedFP16Matrix(np.arange(12, dtype=np.float16).reshape(3, 4))
    feeds = {"x": np.ones((2, 3), np.float32), "w": packed, "b": np.zeros(4, np.float32)}
    net = create_net("fc", [make_op("FbFCPacked", ["x", "w", "b"], ["y"])])
    want = np.ones((2, 3), np.float32) @ np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(rnn2jax.compile(net, outputs=["y"])(feeds)["y"]), want)
    workspace = rnn2jax.Workspace()
    for name, value in feeds.items():
        workspace.feed(name, value)
    workspace.run(net)
    np.testing.assert_array_equal(workspace.fetch("y"), want)
    fetched = workspace.fetch("w")
    assert isinstance(fetched, PackedFP16Matrix) and isinstance(fetched.b, np.ndarray)
    save = make_op("Save", ["w"], [], db=str(tmp_path / "w.minidb"), db_type="minidb", absolute_path=1)
    with pytest.raises(StorageError, match="blob 'w' holds a PackedFP16Matrix, which cannot be saved"):
        workspace.run(create_net("save", [save]))
