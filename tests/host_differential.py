"""Differential tests of host ops: run the same net in real Caffe2 (the oracle's RunNetOnce) and in an
rnn2jax `Workspace`, and compare every tensor blob. Caffe2 leaves out blobs that are not tensors (queues,
counters, empty blobs); so does `array_blobs`. Where Caffe2's net fails, rnn2jax's must raise an
`Rnn2JaxError`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rnn2jax.caffe2.opdef import create_net
from rnn2jax.checking.oracle import Caffe2Error
from rnn2jax.errors import Rnn2JaxError
from rnn2jax.ir.int8 import Int8Tensor
from rnn2jax.proto import caffe2_pb2 as pb
from rnn2jax.runtime.workspace import CompileCache, Workspace
from tests.differential import assert_blob_equal


def array_blobs(workspace: Workspace, skip: Iterable[str] = ()) -> dict[str, np.ndarray]:
    """The workspace's tensor blobs as NumPy arrays (strings as object arrays of bytes; Int8 blobs with NumPy data)."""
    skipped = set(skip)
    out = {}
    for name in workspace.blobs():
        value = workspace.get(name)
        if name in skipped:
            continue
        if isinstance(value, jax.Array | np.ndarray):
            out[name] = np.asarray(value)
        elif isinstance(value, Int8Tensor):
            out[name] = Int8Tensor(np.asarray(value.data), value.scale, value.zero_point)
    return out


_CACHE = CompileCache()  # one for every test, so a net compiles once however many examples run it


def run_rnn2jax_net(ops: Sequence[pb.OperatorDef], feeds: Mapping[str, Any]) -> Workspace | Rnn2JaxError:
    """Run `ops` as one net in a fresh workspace fed `feeds`: the workspace, or the error it raised."""
    workspace = Workspace(cache=_CACHE)
    for name, value in feeds.items():
        workspace.feed(name, value)
    try:
        workspace.run(create_net("host_ops", list(ops)))
    except Rnn2JaxError as error:
        return error
    return workspace


def check_net(
    caffe2: Any,
    ops: Sequence[pb.OperatorDef],
    feeds: Mapping[str, Any] | None = None,
    *,
    values_of: Iterable[str] | None = None,
    fails: bool | None = None,
    placeholders: Iterable[str] = (),
) -> tuple[Workspace | None, dict[str, np.ndarray] | None]:
    """Run `ops` as one net in both; the same tensor blobs, of the same dtypes and shapes, and the same
    values for `values_of` (every blob when None: timers and clocks compare by shape and dtype only).
    `fails` asserts whether Caffe2 fails; `placeholders` are rnn2jax's tensors standing for Caffe2 objects
    (CreateMutex's mutex). Returns rnn2jax's workspace and Caffe2's blobs (None on failure)."""
    feeds = dict(feeds or {})
    try:
        want = caffe2.run([("net", create_net("host_ops", list(ops)))], feeds, None)
    except Caffe2Error:
        want = None
    got = run_rnn2jax_net(ops, feeds)
    if fails is not None:
        assert (want is None) == fails, f"Caffe2 {'succeeds' if want is not None else 'fails'}"
    if want is None:
        assert isinstance(got, Rnn2JaxError), f"Caffe2 fails, rnn2jax does not: {got!r}"
        return None, None
    if isinstance(got, Rnn2JaxError):
        raise AssertionError(f"Caffe2 succeeds, rnn2jax fails: {got}")
    ours = array_blobs(got, placeholders)
    assert set(ours) == set(want), f"tensor blobs: rnn2jax {sorted(ours)}, Caffe2 {sorted(want)}"
    compared = set(want) if values_of is None else set(values_of)
    for name, value in want.items():
        if name in compared:
            assert_blob_equal(name, ours[name], value)
        else:
            assert ours[name].shape == value.shape and ours[name].dtype == value.dtype, name
    return got, want


def check_save_load(caffe2: Any, tmp_path: Any, make: Sequence[pb.OperatorDef], read: Sequence[pb.OperatorDef],
                    blob: str, fetch: Sequence[str], feeds: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """A host object made by `make` and saved to a minidb by one side, loaded by the other and read by `read`
    into the tensors `fetch`: each side reads the other's file as it reads its own."""
    from rnn2jax.caffe2.opdef import create_operator

    feeds = dict(feeds or {})

    def save(path: str) -> Any:
        return create_operator("Save", [blob], [], db=path, db_type="minidb", absolute_path=1)

    def load(path: str) -> Any:
        return create_operator("Load", [], [blob], db=path, db_type="minidb", absolute_path=1)

    ours, theirs = str(tmp_path / "ours.minidb"), str(tmp_path / "caffe2.minidb")
    workspace = run_rnn2jax_net([*make, save(ours)], feeds)
    assert not isinstance(workspace, Rnn2JaxError), workspace
    caffe2.run([("net", create_net("save", [*make, save(theirs)]))], feeds, [])
    results = {}
    for path in (ours, theirs):
        want = caffe2.run([("net", create_net("load", [load(path), *read]))], feeds, list(fetch))
        got = run_rnn2jax_net([load(path), *read], feeds)
        assert not isinstance(got, Rnn2JaxError), got
        for name in fetch:
            assert_blob_equal(f"{name} ({path})", np.asarray(got.fetch(name)), want[name])
        results[path] = want
    for name in fetch:
        assert_blob_equal(name, results[ours][name], results[theirs][name])


def strings_of(value: np.ndarray) -> np.ndarray:
    """`value` as a string tensor (an object array of bytes, as a workspace holds Caffe2's std::strings): each
    element's text, so a numeric case's draw serves the op on strings too."""
    array = np.asarray(value)
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        out[index] = str(item).encode()
    return out
