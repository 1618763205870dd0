"""Caffe2's `scope`: the current name scope (a blob-name prefix) and device scope, per thread.

A plain `str` blob name is prefixed with the current name scope when an op is created; a
`BlobReference` (a name that was already resolved) is used as is. The device scope is the
`DeviceOption` every op created inside it gets.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..proto import caffe2_pb2

_NAMESCOPE_SEPARATOR = "/"

_threadlocal_scope = threading.local()


def CurrentNameScope() -> str:
    """The current name-scope prefix: '' or ending with '/'."""
    return getattr(_threadlocal_scope, "namescope", "")


def CurrentDeviceScope() -> caffe2_pb2.DeviceOption | None:
    return getattr(_threadlocal_scope, "devicescope", None)


@contextmanager
def NameScope(prefix: str | bytes | None, reset: bool = False) -> Iterator[None]:
    """Nest `prefix + '/'` under the current scope (nothing for None or ''), or replace it with `reset`."""
    if isinstance(prefix, bytes):
        prefix = prefix.decode("utf-8")
    old = CurrentNameScope()
    prefix = prefix + _NAMESCOPE_SEPARATOR if prefix else ""
    _threadlocal_scope.namescope = prefix if reset else old + prefix
    try:
        yield
    finally:
        _threadlocal_scope.namescope = old


@contextmanager
def DeviceScope(scope: caffe2_pb2.DeviceOption | None, node_name: str | None = None) -> Iterator[None]:
    """Ops created inside get a copy of `scope` as their device option; nested scopes inherit the outer
    node name and merge its extra_info, as Caffe2's did."""
    new_scope = caffe2_pb2.DeviceOption()
    if scope:
        new_scope.CopyFrom(scope)
    elif not node_name:
        raise ValueError("DeviceScope: give a device option or a node name")
    if node_name:
        new_scope.node_name = node_name
    old_scope = CurrentDeviceScope()
    if old_scope is not None:
        if old_scope.HasField("node_name") and not new_scope.HasField("node_name"):
            new_scope.node_name = old_scope.node_name
        new_scope.extra_info.extend(old_scope.extra_info)
    new_scope.extra_info.sort()
    _threadlocal_scope.devicescope = new_scope
    try:
        yield
    finally:
        _threadlocal_scope.devicescope = old_scope


@contextmanager
def EmptyNameScope() -> Iterator[None]:
    """No name scope inside (blob names are used as given), the outer one restored after."""
    old = CurrentNameScope()
    _threadlocal_scope.namescope = ""
    try:
        yield
    finally:
        _threadlocal_scope.namescope = old


@contextmanager
def EmptyDeviceScope() -> Iterator[None]:
    """No device scope inside, so ops get no device option of their own and the net's decides."""
    old = CurrentDeviceScope()
    _threadlocal_scope.devicescope = None
    try:
        yield
    finally:
        _threadlocal_scope.devicescope = old
