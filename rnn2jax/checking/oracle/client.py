"""The rnn2jax side of the oracle: real Caffe2 in its own interpreter, asked over a pipe.

Caffe2 lives in a Python 3.9 venv (torch 1.10.2, the last wheel that ships it), which cannot share a
process with rnn2jax's stack. `Caffe2Oracle` starts `worker.py` under that interpreter on first use,
sends requests (protobuf messages and NumPy arrays, framed as `.npz` without pickles) and turns the
answers back into rnn2jax's protobuf messages and arrays. A refusal by Caffe2 (an enforce failure)
raises `Caffe2Error`; a crash or a hang of the worker raises `OracleCrashedError` and the next request
starts a fresh worker, so a test is never left waiting on a dead process.
"""

from __future__ import annotations

import io
import json
import os
import select
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import Rnn2JaxError
from ...ir.int8 import Int8Tensor
from ...proto import caffe2_pb2 as pb

WORKER = Path(__file__).with_name("worker.py")


def _int8_fill(name: str, value: Int8Tensor) -> list[pb.OperatorDef]:
    """The Int8GivenTensorFill (uint8 data) or Int8GivenIntTensorFill (int32) that makes blob `name` = `value`;
    for uint16 data (DNNLOWP's _16 engines), a float fill quantized by Quantize_ENGINE_DNNLOWP_16."""
    data = np.asarray(value.data)
    if data.dtype == np.uint16:
        return _uint16_fill(name, value)
    op = pb.OperatorDef(type="Int8GivenIntTensorFill" if data.dtype == np.int32 else "Int8GivenTensorFill")
    op.output.append(name)
    values = op.arg.add(name="values")
    if data.dtype == np.int32:
        values.ints.extend(int(v) for v in data.ravel())
    else:
        values.s = data.astype(np.uint8).tobytes()
    op.arg.add(name="shape").ints.extend(data.shape)
    op.arg.add(name="Y_scale", f=float(value.scale))
    op.arg.add(name="Y_zero_point", i=int(value.zero_point))
    return [op]


def _uint16_fill(name: str, value: Int8Tensor) -> list[pb.OperatorDef]:
    """Real values `(q - zero_point) * scale` that Quantize_ENGINE_DNNLOWP_16 (activation_precision 16) maps back
    to exactly `q`: fbgemm rounds `zero_point + real * (1 / scale)` in float32 (a power-of-two scale always does)."""
    data = np.asarray(value.data)
    scale, zero_point = np.float32(value.scale), int(value.zero_point)
    real = (data.astype(np.int32) - zero_point).astype(np.float32) * scale
    back = np.rint(np.float32(zero_point) + real * (np.float32(1) / scale))
    if not np.array_equal(np.clip(back, 0, 65535), data):
        raise ValueError(f"blob '{name}': this uint16 Int8 tensor cannot be made exactly in Caffe2 (scale {scale})")
    fill = pb.OperatorDef(type="GivenTensorFill", output=[f"{name}__real"])
    fill.arg.add(name="values").floats.extend(float(v) for v in real.ravel())
    fill.arg.add(name="shape").ints.extend(data.shape)
    quantize = pb.OperatorDef(type="Quantize", input=[f"{name}__real"], output=[name], engine="DNNLOWP_16")
    quantize.arg.add(name="activation_precision", i=16)
    quantize.arg.add(name="Y_scale", f=float(scale))
    quantize.arg.add(name="Y_zero_point", i=zero_point)
    return [fill, quantize]


class OracleError(Rnn2JaxError):
    """The real-Caffe2 oracle could not answer."""


class OracleUnavailableError(OracleError):
    """No usable Caffe2 interpreter (missing, or it cannot import caffe2)."""


class OracleCrashedError(OracleError):
    """The worker died (Caffe2 aborted) or did not answer in time; it is restarted on the next request."""


class Caffe2Error(OracleError):
    """Real Caffe2 refused the request (an enforce failure, a missing blob, ...)."""

    def __init__(self, message: str, kind: str = "", trace: str = ""):
        super().__init__(message)
        self.kind = kind
        self.trace = trace


@dataclass(frozen=True)
class Catalog:
    """What the real Caffe2 build offers: its registered ops and each op's schema file."""

    versions: dict[str, str]
    ops: tuple[str, ...]
    schema_files: dict[str, str]


Message = pb.OperatorDef | pb.NetDef | pb.PlanDef


def _encode(message: Message | bytes) -> np.ndarray:
    data = message if isinstance(message, bytes) else message.SerializeToString()
    return np.frombuffer(data, dtype=np.uint8)


def _decode(array: np.ndarray, cls: type) -> Any:
    message = cls()
    message.ParseFromString(array.tobytes())
    return message


def _portable(array: Any) -> np.ndarray:
    """An array NumPy 1.x reads without pickles: strings become fixed-width bytes."""
    array = np.asarray(array)
    if array.dtype.kind in "OU":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.ravel()]
        width = max([len(v) for v in items] + [1])
        return np.array(items, dtype=f"S{width}").reshape(array.shape)
    return np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d arrays 1-d


class _Request:
    """Collects the arrays of one request and hands out their indices for the JSON header."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def add(self, array: Any) -> int:
        self.arrays.append(_portable(array))
        return len(self.arrays) - 1

    def proto(self, message: Message | bytes) -> int:
        self.arrays.append(_encode(message))
        return len(self.arrays) - 1


def _frame(header: Mapping[str, Any], arrays: Sequence[np.ndarray]) -> bytes:
    payload = {f"a{i}": a for i, a in enumerate(arrays)}
    text = json.dumps(dict(header, __arrays__=len(arrays))).encode()
    payload["__json__"] = np.frombuffer(text, dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    body = buffer.getvalue()
    return struct.pack(">Q", len(body)) + body


def _unframe(body: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
    with np.load(io.BytesIO(body), allow_pickle=False) as archive:
        header = json.loads(archive["__json__"].tobytes().decode())
        arrays = [archive[f"a{i}"] for i in range(header.pop("__arrays__", 0))]
    return header, arrays


class Caffe2Oracle:
    """A long-lived real-Caffe2 worker under `python` (an interpreter of the Caffe2 venv)."""

    def __init__(self, python: str | os.PathLike, timeout: float = 600.0):
        self.python = str(python)
        self.timeout = timeout
        self._process: subprocess.Popen | None = None
        self._stderr: Any = None
        self._catalog: Catalog | None = None

    # -- process ---------------------------------------------------------------------------------

    def _start(self) -> subprocess.Popen:
        if not Path(self.python).exists():
            raise OracleUnavailableError(f"no Caffe2 interpreter at {self.python} (run `rnn2jax setup-caffe2`)")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env.pop("PYTHONPATH", None)  # the worker must see its own venv's packages, not ours
        self._process = subprocess.Popen(
            [self.python, "-u", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        return self._process

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Caffe2Oracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stderr_tail(self, limit: int = 3000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace")
        return text[-limit:]

    def _crashed(self, what: str) -> OracleCrashedError:
        tail = self._stderr_tail()
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.wait()
            what += f" (exit status {process.returncode})"
        self._process = None
        return OracleCrashedError(f"the Caffe2 worker {what}" + (f"; its last output:\n{tail}" if tail else ""))

    def _read(self, fd: int, count: int, deadline: float) -> bytes:
        chunks = []
        while count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise self._crashed(f"gave no answer within {self.timeout:.0f} s")
            chunk = os.read(fd, min(count, 1 << 20))
            if not chunk:
                raise self._crashed("died")
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def request(self, command: str, header: Mapping[str, Any], request: _Request) -> tuple[dict, list[np.ndarray]]:
        """Send one request; return the answer's header and arrays, or raise `Caffe2Error`."""
        process = self._process if self._process is not None and self._process.poll() is None else self._start()
        try:
            process.stdin.write(_frame(dict(header, cmd=command), request.arrays))
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._crashed("died before it read the request") from None
        deadline = time.monotonic() + self.timeout
        fd = process.stdout.fileno()
        (size,) = struct.unpack(">Q", self._read(fd, 8, deadline))
        answer, arrays = _unframe(self._read(fd, size, deadline))
        if not answer.pop("ok", False):
            error = answer.get("error", {})
            raise Caffe2Error(error.get("message", "unknown error"), error.get("type", ""), error.get("traceback", ""))
        return answer, arrays

    # -- questions -------------------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """Registered ops, gradient makers and schema files of the real Caffe2 build (asked once)."""
        if self._catalog is None:
            try:
                answer, _ = self.request("hello", {}, _Request())
            except Caffe2Error as error:
                raise OracleUnavailableError(f"{self.python} cannot run Caffe2: {error}") from None
            except OracleCrashedError as error:
                raise OracleUnavailableError(f"{self.python} cannot start the Caffe2 worker: {error}") from None
            versions = {k: answer[k] for k in ("python", "torch", "numpy")}
            self._catalog = Catalog(versions, tuple(answer["ops"]), answer["schema_files"])
        return self._catalog

    def gradient_kinds(self, ops: Iterable[str] | None = None) -> dict[str, str]:
        """What Caffe2's gradient registry says of each op (every registered op by default): "gradient",
        "no_gradient", "should_not", "not_implemented" or "none"."""
        answer, _ = self.request("gradient_kinds", {"ops": None if ops is None else list(ops)}, _Request())
        return answer["kinds"]

    def run(
        self,
        steps: Iterable[tuple[str, Any]],
        feeds: Mapping[str, Any] | None = None,
        fetch: Iterable[str] | None = None,
        *,
        workspace: str = "oracle",
        reset: bool = True,
    ) -> dict[str, np.ndarray]:
        """Feed `feeds`, run `steps` in order, and fetch `fetch` (every blob when None).

        A step is `("op", OperatorDef)`, `("ops", [OperatorDef, ...])`, `("net", NetDef)` (RunNetOnce),
        `("create_net", NetDef)`, `("run_net", (name, num_iter))` or `("plan", PlanDef)`. Device options
        are set to the CPU first, nested step nets included. Blobs that are not tensors are left out.
        """
        request = _Request()
        encoded = []
        feeds = dict(feeds or {})
        # Caffe2's FeedBlob takes no Int8TensorCPU: such a feed becomes the fill op that makes it.
        int8 = [name for name in feeds if isinstance(feeds[name], Int8Tensor)]
        fills = [fill for name in int8 for fill in _int8_fill(name, feeds.pop(name))]
        steps = [("op", fill) for fill in fills] + list(steps)
        for kind, value in steps:
            if kind == "ops":
                encoded.append({"kind": kind, "protos": [request.proto(v) for v in value]})
            elif kind == "run_net":
                name, num_iter = value if isinstance(value, tuple) else (value, 1)
                encoded.append({"kind": kind, "name": name, "num_iter": num_iter})
            else:
                encoded.append({"kind": kind, "proto": request.proto(value)})
        header = {
            "workspace": workspace,
            "reset": reset,
            "feeds": {name: request.add(value) for name, value in feeds.items()},
            "steps": encoded,
            "fetch": None if fetch is None else list(fetch),
        }
        try:
            answer, arrays = self.request("run", header, request)
        except OracleCrashedError as crash:
            # Some Caffe2 ops write out of bounds on inputs they should refuse, and the heap damage can kill
            # the worker during a later request. A self-contained request (a fresh workspace) is asked once
            # more, of a fresh worker: it fails only if it kills that one too. A timeout is not retried.
            if not reset or "worker died" not in str(crash):
                raise
            try:
                answer, arrays = self.request("run", header, request)
            except OracleCrashedError as again:
                raise again from crash
        blobs = {name: arrays[i] for name, i in answer["blobs"].items()}
        for name, (scale, zero_point) in answer.get("int8", {}).items():  # Int8TensorCPU blobs
            blobs[name] = Int8Tensor(blobs[name], scale, zero_point)
        return blobs

    def run_op(
        self, op: pb.OperatorDef, inputs: Mapping[str, Any], fetch: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        """RunOperatorOnce in a fresh workspace; by default fetch the op's outputs."""
        return self.run([("op", op)], inputs, list(op.output) if fetch is None else fetch)

    def run_net(
        self, net: pb.NetDef, inputs: Mapping[str, Any], fetch: Iterable[str] | None = None
    ) -> dict[str, np.ndarray]:
        """RunNetOnce in a fresh workspace; every blob when `fetch` is None."""
        return self.run([("net", net)], inputs, fetch)

    def gradient_for_op(
        self, op: pb.OperatorDef, g_output: Sequence[str | None]
    ) -> tuple[list[pb.OperatorDef], list[Any]]:
        """`core.GradientRegistry.GetGradientForOp`: the gradient ops and the input gradient names
        (a name, None, or {"indices", "values"} for a GradientSlice)."""
        request = _Request()
        answer, arrays = self.request("gradient_for_op", {"op": request.proto(op), "g_output": list(g_output)}, request)
        return [_decode(arrays[i], pb.OperatorDef) for i in answer["ops"]], answer["g_input"]

    def python_ops(self, functions: Mapping[str, str]) -> dict[str, str]:
        """Register Python ops in the worker from source (name -> code defining `name(inputs, outputs)`);
        returns the token of each, for an OperatorDef of type "Python" with argument `token`."""
        answer, _ = self.request("python_ops", {"functions": dict(functions)}, _Request())
        return answer["tokens"]

    def backward_pass(
        self, ops: Sequence[pb.OperatorDef], ys: Mapping[str, str | None]
    ) -> tuple[list[pb.OperatorDef], dict[str, Any]]:
        """`core.GradientRegistry.GetBackwardPass(ops, ys)`: gradient ops and the gradient map."""
        request = _Request()
        header = {"ops": [request.proto(op) for op in ops], "ys": dict(ys)}
        answer, arrays = self.request("backward_pass", header, request)
        return [_decode(arrays[i], pb.OperatorDef) for i in answer["ops"]], answer["grad_map"]

    def build(
        self,
        calls: Sequence[Mapping[str, Any]],
        models: Mapping[str, Mapping[str, Any]] | None = None,
        arrays: Sequence[Any] = (),
    ) -> tuple[dict[str, tuple[pb.NetDef, pb.NetDef]], list[Any]]:
        """Run Caffe2 front-end calls from a JSON recipe; return each model's (net, param_init_net) and
        what each call returned (blob names as strings).

        A call is `{"fn": "rnn_cell.LSTM", "args": [...], "kwargs": {...}, "scope": "..."}`, or
        `{"fn": <value>, "method": "name", ...}`. Values may be `{"$model": name}`, `{"$blob": name}`,
        `{"$ref": [call index, item or attribute, ...]}`, `{"$call": call}`, `{"$tuple": [...]}`,
        `{"$get": "attention.AttentionType.Regular"}`, `{"$net": array index}` or `{"$array": index}`
        (into `arrays`). Net names restart for every build, as in a fresh Caffe2 process.
        """
        request = _Request()
        for array in arrays:
            if isinstance(array, pb.NetDef):
                request.proto(array)
            else:
                request.add(array)
        header = {"calls": list(calls), "models": dict(models or {"model": {"name": "model"}})}
        answer, out = self.request("build", header, request)
        nets = {
            name: (_decode(out[entry["net"]], pb.NetDef), _decode(out[entry["init"]], pb.NetDef))
            for name, entry in answer["nets"].items()
        }
        return nets, answer["results"]

    def save_predictor(
        self,
        path: str | os.PathLike,
        net: pb.NetDef,
        feeds: Mapping[str, Any],
        parameters: Sequence[str],
        inputs: Sequence[str],
        outputs: Sequence[str],
        *,
        db_type: str = "minidb",
        name: str = "",
    ) -> None:
        """Write a predictor export with real Caffe2's `predictor_exporter.save_to_db`: `feeds` (the
        parameters and example inputs) are fed and `net` runs once first, so the export's predict-init net
        knows the shapes of the inputs and outputs."""
        request = _Request()
        header = {
            "db": os.fspath(path),
            "db_type": db_type,
            "net": request.proto(net),
            "feeds": {blob: request.add(value) for blob, value in feeds.items()},
            "parameters": list(parameters),
            "inputs": list(inputs),
            "outputs": list(outputs),
            "name": name,
        }
        self.request("save_predictor", header, request)

    def run_predictor(
        self, path: str | os.PathLike, inputs: Mapping[str, Any], fetch: Iterable[str], *, db_type: str = "minidb"
    ) -> dict[str, np.ndarray]:
        """Load a predictor export with real Caffe2's `prepare_prediction_net`, feed `inputs`, run the
        predict net and fetch the blobs `fetch`."""
        request = _Request()
        header = {
            "db": os.fspath(path),
            "db_type": db_type,
            "feeds": {blob: request.add(value) for blob, value in inputs.items()},
            "fetch": list(fetch),
        }
        answer, arrays = self.request("run_predictor", header, request)
        return {blob: arrays[i] for blob, i in answer["blobs"].items()}
