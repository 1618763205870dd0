"""The dataset family (rnn2jax/ops/dataset.py) against real Caffe2 (torch 1.10.2).

Append and AtomicAppend are lowered too: their differential `CASES` run them compiled. Every op also runs
as a host op in a Workspace: the same net runs in real Caffe2 (`run_net`) and in rnn2jax's Workspace, and
every tensor blob it makes must agree (cursors, readers and packed records are host objects, compared
through what the ops read out of them). Where Caffe2 refuses, rnn2jax must raise an Rnn2JaxError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rnn2jax
from differential import Case, assert_blob_equal, cases, make_op, run_case
from rnn2jax.caffe2.opdef import create_net
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import BadArgumentError, InputTypeError, Rnn2JaxError
from rnn2jax.ops.dataset import TreeIterator, strtof

# ----------------------------------------------------------------------------------------------------
# Datasets: a schema (fields, each in a domain, lengths fields opening domains) and data that fits it

# (field, dtype, inner shape, its domain, the domain it opens); domain 0 is the top level
SCHEMAS = {
    "flat": [("k", np.int32, (), 0, None), ("a", np.float32, (2,), 0, None)],
    "list": [
        ("k", np.int32, (), 0, None),
        ("b:lengths", np.int32, (), 0, 1),
        ("b:values", np.int64, (), 1, None),
    ],
    "nested": [
        ("k", np.int32, (), 0, None),
        ("a", np.float32, (2,), 0, None),
        ("b:lengths", np.int32, (), 0, 1),
        ("b:values:lengths", np.int32, (), 1, 2),
        ("b:values:values", np.int64, (), 2, None),
        ("c:lengths", np.int32, (), 0, 3),
        ("c:c1", object, (), 3, None),
        ("c:c2:lengths", np.int32, (), 3, 4),
        ("c:c2:values", np.float32, (), 4, None),
    ],
}
WORDS = st.binary(min_size=0, max_size=4)


@st.composite
def datasets(draw: Any, min_rows: int = 0, max_rows: int = 6) -> tuple[list[str], dict[str, np.ndarray]]:
    """(fields, blobs f0, f1, ... holding them)."""
    schema = SCHEMAS[draw(st.sampled_from(sorted(SCHEMAS)))]
    sizes = {0: draw(st.integers(min_rows, max_rows))}
    blobs = {}
    for i, (_name, dtype, inner, domain, opens) in enumerate(schema):
        rows = sizes[domain]
        if opens is not None:
            values = np.array(draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows)), np.int32)
            sizes[opens] = int(values.sum())
        elif dtype is object:
            values = np.array([*draw(st.lists(WORDS, min_size=rows, max_size=rows)), b""], dtype=object)[:rows]
        elif np.dtype(dtype).kind == "f":
            count = rows * int(np.prod(inner))
            floats = draw(st.lists(st.floats(-10, 10, width=32), min_size=count, max_size=count))
            values = np.array(floats, dtype).reshape((rows, *inner))
        else:
            values = np.array(draw(st.lists(st.integers(-5, 5), min_size=rows, max_size=rows)), dtype)
        blobs[f"f{i}"] = values
    return [name for name, *_ in schema], blobs


def ours(nets: Sequence[Any], feeds: dict[str, Any], fetch: Sequence[str]) -> dict[str, np.ndarray]:
    workspace = rnn2jax.Workspace()
    for name, value in feeds.items():
        workspace.put(name, value)
    for net in nets:
        workspace.run(net)
    return {name: np.asarray(workspace.fetch(name)) for name in fetch if workspace.has_blob(name)}


def assert_same_run(caffe2: Any, ops: Sequence[Any], feeds: dict[str, Any], fetch: Sequence[str]) -> None:
    """The ops as one net in Caffe2 and in a Workspace: the same blobs, or a refusal in both."""
    net = create_net("dataset", list(ops))
    try:
        want = caffe2.run([("net", net)], feeds, list(fetch))
    except Caffe2Error as refusal:
        with pytest.raises(Rnn2JaxError):
            ours([net], feeds, fetch)
            pytest.fail(f"Caffe2 refuses ({str(refusal)[:300]}) but rnn2jax ran the net")
        return
    got = ours([net], feeds, fetch)
    # ReadRandomBatch leaves an output it reads no rows into without a dtype (Caffe2 cannot fetch it): rnn2jax
    # gives it the field's dtype, and it must be empty
    unset = set(got) - set(want)
    assert all(got[name].size == 0 for name in unset), f"Caffe2 leaves {sorted(unset)} unset, rnn2jax fills them"
    assert set(want) <= set(got), f"rnn2jax lacks {sorted(set(want) - set(got))}"
    for name in want:
        assert_blob_equal(name, got[name], want[name], rtol=0.0)


def broken(data: st.DataObject, fields: list[str], blobs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dataset with one lengths field claiming a row too many, or one field a row short."""
    names = list(blobs)
    lengths = [n for n, f in zip(names, fields, strict=True) if f.endswith("lengths")]
    victim = data.draw(st.sampled_from(names))
    value = blobs[victim]
    return {**blobs, victim: value + 1 if victim in lengths else value[:-1] if len(value) else value}


# ----------------------------------------------------------------------------------------------------
# Cursors: CreateTreeCursor, ReadNextBatch, GetCursorOffset, ResetCursor, ComputeOffset


@given(dataset=datasets(), data=st.data())
def test_read_next_batch_matches_caffe2(caffe2, dataset, data):
    fields, blobs = dataset
    if data.draw(st.integers(0, 3)) == 0:
        blobs = broken(data, fields, blobs)
    names = list(blobs)
    ops = [make_op("CreateTreeCursor", [], ["cursor"], fields=fields)]
    fetch = []
    for step in range(data.draw(st.integers(1, 4))):
        if data.draw(st.booleans()) and step:
            ops.append(make_op("ResetCursor", ["cursor"], []))
        outputs = [f"r{step}_{name}" for name in names]
        args = {"batch_size": data.draw(st.integers(0, 3))}
        if data.draw(st.booleans()):
            args["enforce_batch_size"] = 1
        ops.append(make_op("ReadNextBatch", ["cursor", *names], outputs, **args))
        ops.append(make_op("GetCursorOffset", ["cursor"], [f"offset{step}"]))
        fetch += [*outputs, f"offset{step}"]
    if data.draw(st.booleans()):
        ops.append(make_op("ComputeOffset", ["cursor", *names], ["matrix"]))
        ops.append(make_op("GetCursorOffset", ["cursor"], ["after"]))
        fetch += ["matrix", "after"]
    assert_same_run(caffe2, ops, blobs, fetch)


# ----------------------------------------------------------------------------------------------------
# Random reading: ComputeOffset, SortAndShuffle, ReadRandomBatch


@given(dataset=datasets(max_rows=20), data=st.data())
def test_read_random_batch_matches_caffe2(caffe2, dataset, data):
    fields, blobs = dataset
    names = list(blobs)
    ops = [
        make_op("CreateTreeCursor", [], ["cursor"], fields=fields),
        make_op("ComputeOffset", ["cursor", *names], ["offsets"]),
    ]
    fetch = ["offsets"]
    if data.draw(st.booleans()):
        shuffle = {
            "sort_by_field_idx": data.draw(st.sampled_from([-1, 0])),  # field 0 ("k") is int32 at the top level
            "batch_size": data.draw(st.integers(1, 4)),
            "shuffle_size": data.draw(st.integers(1, 4)),
        }
        ops.append(make_op("SortAndShuffle", ["cursor", *names], ["indices"], **shuffle))
    else:
        rows = len(blobs["f0"])
        order = data.draw(st.permutations(range(rows)))
        blobs = {**blobs, "indices": np.array(order, np.int64)}
    fetch.append("indices")
    for step in range(data.draw(st.integers(1, 4))):
        outputs = [f"r{step}_{name}" for name in names]
        args = {"batch_size": data.draw(st.integers(1, 3))}
        if data.draw(st.booleans()):
            args["enforce_batch_size"] = 1
        if data.draw(st.booleans()):
            args["loop_over"] = 1
        ops.append(make_op("ReadRandomBatch", ["cursor", "indices", "offsets", *names], outputs, **args))
        ops.append(make_op("GetCursorOffset", ["cursor"], [f"offset{step}"]))
        fetch += [o for o in outputs if blobs[o.split("_", 1)[1]].size] + [f"offset{step}"]
    assert_same_run(caffe2, ops, blobs, fetch)


@given(keys=st.lists(st.integers(-3, 3), min_size=0, max_size=60), batch=st.integers(1, 5), shuffle=st.integers(1, 5))
def test_sort_and_shuffle_ties_match_caffe2(caffe2, keys, batch, shuffle):
    """Caffe2 sorts with std::sort (unstable beyond 16 entries) and shuffles with a freshly seeded
    std::default_random_engine: the same permutation, ties included."""
    blobs = {"k": np.array(keys, np.int32)}
    ops = [
        make_op("CreateTreeCursor", [], ["cursor"], fields=["k"]),
        make_op(
            "SortAndShuffle", ["cursor", "k"], ["indices"], sort_by_field_idx=0, batch_size=batch, shuffle_size=shuffle
        ),
    ]
    assert_same_run(caffe2, ops, blobs, ["indices"])


# ----------------------------------------------------------------------------------------------------
# Whole datasets: CheckDatasetConsistency, TrimDataset, PackRecords / UnPackRecords


@given(dataset=datasets(), data=st.data())
def test_check_trim_pack_match_caffe2(caffe2, dataset, data):
    fields, blobs = dataset
    names = list(blobs)
    if data.draw(st.booleans()):
        blobs = broken(data, fields, blobs)
    # without the check first, broken data reaches the others, which refuse it as they walk it (TrimDataset
    # walks only up to the records it keeps)
    ops = [make_op("CheckDatasetConsistency", names, [], fields=fields)] if data.draw(st.booleans()) else []
    packed = [f"u_{name}" for name in names]
    single = data.draw(st.integers(0, 1))
    ops.append(make_op("PackRecords", names, ["packed"], fields=fields, pack_to_single_shared_ptr=single))
    if data.draw(st.booleans()):
        ops.append(make_op("UnPackRecords", ["packed", *names], packed, fields=fields))
    else:
        ops.append(make_op("UnPackRecords", ["packed"], packed, fields=fields))
    trim = make_op("TrimDataset", names, names, fields=fields, multiple_of=data.draw(st.integers(1, 4)))
    ops.insert(data.draw(st.integers(0, len(ops))), trim)
    assert_same_run(caffe2, ops, blobs, [*names, *packed])


def test_unpack_of_no_records_needs_prototypes(caffe2):
    fields = ["a"]
    blobs = {"a": np.zeros((0, 3), np.float32)}
    pack = make_op("PackRecords", ["a"], ["p"], fields=fields)
    assert_same_run(caffe2, [pack, make_op("UnPackRecords", ["p"], ["u"], fields=fields)], blobs, ["u"])
    assert_same_run(caffe2, [pack, make_op("UnPackRecords", ["p", "a"], ["u"], fields=fields)], blobs, ["u"])


# ----------------------------------------------------------------------------------------------------
# Append and AtomicAppend: compiled (CASES) and as host ops, strings included


def _rows(data: st.DataObject, rows: int, inner: tuple[int, ...], dtype: Any) -> np.ndarray:
    count = rows * int(np.prod(inner))
    if np.dtype(dtype).kind == "f":
        values = data.draw(st.lists(st.floats(-10, 10, width=32), min_size=count, max_size=count))
    else:
        values = data.draw(st.lists(st.integers(-100, 100), min_size=count, max_size=count))
    return np.array(values, dtype).reshape((rows, *inner))


def draw_append(data: st.DataObject):
    inner = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    dtype = data.draw(st.sampled_from([np.float32, np.int32, np.int64]))
    a = _rows(data, data.draw(st.integers(0, 3)), inner, dtype)
    b = _rows(data, data.draw(st.integers(0, 3)), inner, dtype)
    if data.draw(st.integers(0, 4)) == 0:  # a mismatch Caffe2 refuses: inner shape or dtype
        b = b.astype(np.float64) if data.draw(st.booleans()) else _rows(data, 2, (*inner, 2), dtype)
    return make_op("Append", ["a", "b"], ["a"]), {"a": a, "b": b}


def draw_atomic_append(data: st.DataObject):
    count = data.draw(st.integers(1, 3))
    inputs: dict[str, np.ndarray] = {"mutex": np.zeros((), np.int32)}
    for i in range(count):
        inner = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
        dtype = data.draw(st.sampled_from([np.float32, np.int32, np.int64]))
        inputs[f"a{i}"] = _rows(data, data.draw(st.integers(0, 3)), inner, dtype)
        inputs[f"b{i}"] = _rows(data, data.draw(st.integers(0, 3)), inner, dtype)
    names = [f"a{i}" for i in range(count)]
    return make_op("AtomicAppend", ["mutex", *names, *(f"b{i}" for i in range(count))], names), inputs


CASES = cases(
    Case("Append", draw_append, note="in place; a host op in a workspace (strings too)"),
    Case("AtomicAppend", draw_atomic_append, note="the mutex is CreateMutex's placeholder"),
)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@given(data=st.data())
def test_matches_caffe2(caffe2, case, data):
    op, inputs = case.draw(data)
    if case.op_type == "AtomicAppend":  # Caffe2 wants a real mutex: feed it through CreateMutex
        caffe2_inputs = {k: v for k, v in inputs.items() if k != "mutex"}
        try:
            want = caffe2.run([("op", make_op("CreateMutex", [], ["mutex"])), ("op", op)], caffe2_inputs, op.output)
        except Caffe2Error:
            want = None
        from differential import run_rnn2jax

        if want is None:
            with pytest.raises(Rnn2JaxError):
                run_rnn2jax([op], inputs, op.output)
            return
        got = run_rnn2jax([op], inputs, op.output)
        for name in want:
            assert_blob_equal(name, got[name], want[name], rtol=0.0)
        return
    run_case(caffe2, case, data)


@given(data=st.data())
def test_append_strings_in_a_workspace_match_caffe2(caffe2, data):
    """The dataset writer's appends: string fields as well as numbers, through CreateMutex."""
    first = np.array([*data.draw(st.lists(WORDS, max_size=3)), b""], dtype=object)[:-1]
    second = np.array(data.draw(st.lists(WORDS, min_size=1, max_size=3)), dtype=object)
    numbers = {"n": np.arange(len(first), dtype=np.int64), "m": np.arange(len(second), dtype=np.int64)}
    ops = [
        make_op("Append", ["s", "t"], ["s"]),
        make_op("CreateMutex", [], ["mutex"]),
        make_op("AtomicAppend", ["mutex", "s", "n", "t", "m"], ["s", "n"]),
    ]
    assert_same_run(caffe2, ops, {"s": first, "t": second, **numbers}, ["s", "n"])


def test_append_must_run_in_place():
    net = create_net("n", [make_op("Append", ["a", "b"], ["c"])])
    with pytest.raises(BadArgumentError, match="in place"):
        ours([net], {"a": np.zeros((1, 2), np.float32), "b": np.zeros((1, 2), np.float32)}, ["c"])


# ----------------------------------------------------------------------------------------------------
# Refusals


def test_refusals_match_caffe2(caffe2):
    blobs = {"l": np.array([2, 1], np.int32), "v": np.arange(2, dtype=np.int64)}
    fields = ["b:lengths", "b:values"]
    cursor = make_op("CreateTreeCursor", [], ["cursor"], fields=fields)
    read = make_op("ReadNextBatch", ["cursor", "l", "v"], ["x", "y"], batch_size=2)
    assert_same_run(caffe2, [cursor, read], blobs, ["x", "y"])  # the lengths ask for 3 values of 2
    assert_same_run(caffe2, [cursor, make_op("ReadNextBatch", ["cursor", "l"], ["x"])], blobs, ["x"])
    consistency = make_op("CheckDatasetConsistency", ["l", "v"], [], fields=fields)
    assert_same_run(caffe2, [consistency], blobs, [])
    later = make_op("CreateTreeCursor", [], ["cursor"], fields=["b:values", "b:lengths"])
    assert_same_run(caffe2, [later, make_op("GetCursorOffset", ["cursor"], ["o"])], {}, ["o"])
    net = create_net("n", [make_op("GetCursorOffset", ["l"], ["o"])])
    with pytest.raises(InputTypeError, match="not a cursor"):
        ours([net], blobs, ["o"])


def test_tree_iterator_domains():
    """Caffe2's CreateTreeCursor example: each field's domain is its longest matching lengths prefix."""
    fields = [
        "a",
        "b:lengths",
        "b:values:lengths",
        "b:values:values",
        "c:lengths",
        "c:c1",
        "c:c2:lengths",
        "c:c2:values",
    ]
    it = TreeIterator.of(fields)
    assert it.length_fields == (1, 2, 4, 6)
    assert it.domain == (0, 0, 1, 2, 0, 3, 3, 4)


# ----------------------------------------------------------------------------------------------------
# The text file reader: CreateTextFileReader, TextFileReaderRead

STRING, FLOAT = 4, 1
CELL = st.text(alphabet="abc xyz.-01", min_size=0, max_size=5)


@given(data=st.data())
def test_text_file_reader_matches_caffe2(caffe2, tmp_path_factory, data):
    types = data.draw(st.lists(st.sampled_from([STRING, FLOAT]), min_size=1, max_size=3))
    rows = []
    for _ in range(data.draw(st.integers(0, 5))):
        row = []
        for kind in types:
            if kind == FLOAT:
                row.append(repr(data.draw(st.floats(-1e4, 1e4, width=32))) if data.draw(st.integers(0, 29)) else "x")
            else:
                row.append(data.draw(CELL))
        rows.append("\t".join(row))
    text = "\n".join(rows) + ("\n" if data.draw(st.integers(0, 3)) else "")
    if data.draw(st.integers(0, 5)) == 0:
        text += "extra\tcolumns\tand\tmore\n"
    path = tmp_path_factory.mktemp("text") / "data.tsv"
    path.write_text(text)
    ops = [
        make_op(
            "CreateTextFileReader",
            [],
            ["reader"],
            filename=str(path),
            field_types=types,
            num_passes=data.draw(st.integers(1, 2)),
        )
    ]
    fetch = []
    for step in range(data.draw(st.integers(1, 4))):
        outputs = [f"r{step}_{i}" for i in range(len(types))]
        ops.append(make_op("TextFileReaderRead", ["reader"], outputs, batch_size=data.draw(st.integers(1, 4))))
        fetch += outputs
    assert_same_run(caffe2, ops, {}, fetch)


def test_text_file_reader_refusals(caffe2, tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_text("a\t1.5\nb\n")
    create = make_op("CreateTextFileReader", [], ["reader"], filename=str(path), field_types=[STRING, FLOAT])
    read = make_op("TextFileReaderRead", ["reader"], ["s", "f"], batch_size=4)
    assert_same_run(caffe2, [create, read], {}, ["s", "f"])
    missing = make_op("CreateTextFileReader", [], ["reader"], filename=str(tmp_path / "none"), field_types=[STRING])
    assert_same_run(caffe2, [missing], {}, [])
    assert_same_run(caffe2, [create, make_op("TextFileReaderRead", ["reader"], ["s"])], {}, ["s"])


def test_strtof_reads_a_prefix():
    assert strtof(b" 1.5e2xyz") == np.float32(150.0)
    assert strtof(b"-inf") == -np.inf
    assert strtof(b"0x1p3") == np.float32(8.0)
    assert strtof(b"abc") is None


@given(shape=st.lists(st.integers(0, 3), max_size=3), value=st.sampled_from([None, "", "ab"]), data=st.data())
def test_string_constant_fill_matches_caffe2(caffe2, shape, value, data):
    """ConstantFill of dtype STRING (what Dataset.init_empty makes string fields with) runs on the host."""
    args = {"dtype": STRING} if value is None else {"dtype": STRING, "value": value}
    feeds = {}
    if data.draw(st.booleans()):
        feeds = {"x": np.zeros(shape, np.float32)}
        fill = make_op(
            "ConstantFill", ["x"], ["y"], extra_shape=data.draw(st.lists(st.integers(1, 2), max_size=1)), **args
        )
    else:
        fill = make_op("ConstantFill", [], ["y"], shape=shape, **args)
    numbers = make_op("ConstantFill", [], ["n"], shape=[2], value=3.0)  # the type's other ops stay lowered
    assert_same_run(caffe2, [fill, numbers], feeds, ["y", "n"])


def test_shape_only_ops_read_string_blobs(caffe2):
    """IsEmpty, Shape and Size read only a blob's shape, so they take string fields (TextFileReader's
    read_record asks IsEmpty of its first field)."""
    words = {"s": np.array([[b"a", b"b"], [b"c", b""]], dtype=object), "e": np.array([], dtype=object)}
    ops = [
        make_op("IsEmpty", ["s"], ["s_empty"]),
        make_op("IsEmpty", ["e"], ["e_empty"]),
        make_op("Shape", ["s"], ["shape"]),
        make_op("Size", ["s"], ["size"]),
    ]
    assert_same_run(caffe2, ops, words, ["s_empty", "e_empty", "shape", "size"])


@given(dataset=datasets(), data=st.data())
def test_cursors_save_and_load_as_in_caffe2(caffe2, tmp_path_factory, dataset, data):
    """A cursor Saved by one and Loaded by the other reads on from where it was (Caffe2's TreeCursorSerializer:
    the offsets as an int64 tensor, the fields in the content)."""
    fields, blobs = dataset
    names = list(blobs)
    root = tmp_path_factory.mktemp("cursors")
    reads = [make_op("ReadNextBatch", ["cursor", *names], [f"x_{n}" for n in names], batch_size=1)]
    before = [make_op("CreateTreeCursor", [], ["cursor"], fields=fields)] + reads * data.draw(st.integers(0, 2))
    after = [*reads, make_op("GetCursorOffset", ["cursor"], ["offsets"])]
    fetch = ["offsets", *(f"x_{n}" for n in names)]
    for writer in ("caffe2", "rnn2jax"):
        db = str(root / f"{writer}.minidb")
        save = make_op("Save", ["cursor"], [], db=db, db_type="minidb", absolute_path=1)
        load = make_op("Load", [], ["cursor"], db=db, db_type="minidb", absolute_path=1)
        if writer == "caffe2":
            caffe2.run([("net", create_net("save", [*before, save]))], blobs, [])
        else:
            ours([create_net("save", [*before, save])], blobs, [])
        reader = create_net("load", [load, *after])
        want = caffe2.run([("net", reader)], blobs, fetch)
        got = ours([reader], blobs, fetch)
        for name in want:
            assert_blob_equal(name, got[name], want[name], rtol=0.0)
