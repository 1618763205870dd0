"""`rnn2jax run-plan --tensorboard DIR`: the event file holds, per logged blob, the values the workspace had.

The event file is read back here with an own TFRecord reader (u64 length, masked CRC-32C of it, the bytes,
their masked CRC-32C; both checksums checked) and tensorboardX's Event message. The references: the values
a small plan's arithmetic gives (powers of two, exact in float32), and for the real breadbread train plan
the losses a separate Workspace run records, the first of them against the NumPy cross-entropy of the
first batch, the last against what the command prints.
"""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

import rnn2jax
from helpers import REALNETS
from rnn2jax.cli import main
from rnn2jax.proto import caffe2_pb2 as pb

pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
from tensorboardX.proto.event_pb2 import Event

TRAIN_PLAN = REALNETS / "breadbread_lstmdemo_train_plan.pbtxt"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 bits plus a constant."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag from the one event file in `logdir`."""
    (path,) = logdir.glob("events.out.tfevents.*")
    data, at, scalars = path.read_bytes(), 0, {}
    events = []
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert header_crc == masked_crc32c(header), f"bad length checksum at byte {at}"
        body = data[at + 12 : at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert len(body) == length and body_crc == masked_crc32c(body), f"bad record at byte {at}"
        events.append(Event.FromString(body))
        at += 16 + length
    assert events[0].file_version.startswith("brain.Event:")
    for event in events[1:]:
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def tiny_plan(path, loss_name: str = "avg_loss") -> None:
    """x = [1, 2, 3, 4]; then 4 times: x *= 0.5, loss = mean(x): exact in float32."""
    init = pb.NetDef(name="init", external_output=["x"])
    fill = init.op.add(type="GivenTensorFill", output=["x"])
    fill.arg.add(name="shape", ints=[4])
    fill.arg.add(name="values", floats=[1, 2, 3, 4])
    train = pb.NetDef(name="train", external_input=["x"])
    scale = train.op.add(type="Scale", input=["x"], output=["x"])
    scale.arg.add(name="scale", f=0.5)
    train.op.add(type="AveragedLoss", input=["x"], output=[loss_name])
    plan = pb.PlanDef(name="tiny", network=[init, train])
    plan.execution_step.add(name="init", network=["init"], num_iter=1)
    plan.execution_step.add(name="train", network=["train"], num_iter=4)
    path.write_bytes(plan.SerializeToString())


def test_tiny_plan_loss_and_mean(tmp_path, capsys):
    tiny_plan(tmp_path / "plan.pb")
    # without --log: the blobs named like a loss
    assert main(["run-plan", str(tmp_path / "plan.pb"), "--tensorboard", str(tmp_path / "auto")]) == 0
    assert "--tensorboard logs avg_loss (" in capsys.readouterr().err
    want = [(k, 2.5 * 0.5 ** (k + 1)) for k in range(4)]
    assert read_scalars(tmp_path / "auto") == {"avg_loss": want}
    # --log x: a blob of 4 values is written as its mean, under x/mean; its first value is the init net's
    logged = ["--log", "x", "--log", "avg_loss"]
    assert main(["run-plan", str(tmp_path / "plan.pb"), *logged, "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "wrote TensorBoard scalars to" in capsys.readouterr().out
    means = [(k, 2.5 * 0.5**k) for k in range(5)]
    assert read_scalars(tmp_path / "tb") == {"x/mean": means, "avg_loss": want}


def test_errors_name_the_extra_and_the_choice(tmp_path, capsys, monkeypatch):
    tiny_plan(tmp_path / "plan.pb", loss_name="avg")
    assert main(["run-plan", str(tmp_path / "plan.pb"), "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert "plan 'tiny' writes no blob named like a loss" in err and "--log" in err
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` fails
    assert main(["run-plan", str(tmp_path / "plan.pb"), "--log", "avg", "--tensorboard", str(tmp_path / "tb")]) == 2
    assert "pip install 'rnn2jax[tensorboard]'" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()  # nothing ran


@pytest.mark.skipif(not TRAIN_PLAN.exists(), reason=f"real nets folder {REALNETS} is absent")
def test_breadbread_training_curve(tmp_path, capsys, monkeypatch):
    pytest.importorskip("lmdb", reason="the lmdb extra is not installed")
    from test_breadbread_e2e import BATCH, HIDDEN, WEIGHTS, loss_reference, write_dataset

    # beside the command's own observer, the test reads the workspace after every iteration: the loss of
    # each training iteration (each run of the train net advances optimizer_iteration), the first weights
    losses, initial = [], {}
    run_plan = rnn2jax.Workspace.run_plan

    def spied(workspace, plan, *, observer, **kwargs):
        def both(path, iteration, num_iter):
            observer(path, iteration, num_iter)
            if not initial and workspace.has_blob("LSTM/i2h_w"):
                initial.update({name: workspace.fetch(name) for name in WEIGHTS})
            if workspace.has_blob("loss") and int(workspace.fetch("optimizer_iteration")[0]) > len(losses):
                losses.append(workspace.fetch("loss"))

        return run_plan(workspace, plan, observer=both, **kwargs)

    monkeypatch.setattr(rnn2jax.Workspace, "run_plan", spied)
    iters = 3
    samples = write_dataset(tmp_path / "dataset", np.random.default_rng(0))
    logged = ["--log", "loss", "--log", "softmax"]
    args = ["run-plan", str(TRAIN_PLAN), "--db-root", str(tmp_path), "--iters", str(iters), *logged]
    assert main([*args, "--tensorboard", str(tmp_path / "tb")]) == 0
    printed = capsys.readouterr().out
    scalars = read_scalars(tmp_path / "tb")

    assert len(losses) == iters
    assert scalars["loss"] == [(k, float(np.float32(loss))) for k, loss in enumerate(losses)]
    zeros = np.zeros((BATCH, HIDDEN))
    assert scalars["loss"][0][1] == pytest.approx(loss_reference(initial, samples[:BATCH], zeros, zeros), rel=1e-4)
    assert f"loss: {losses[-1]:.6g}" in printed
    # softmax [T, N, 62] sums to 1 over its last axis: its mean is 1/62 at every iteration
    assert [step for step, _ in scalars["softmax/mean"]] == list(range(iters))
    np.testing.assert_allclose([v for _, v in scalars["softmax/mean"]], 1 / 62, rtol=1e-5)
    assert set(scalars) == {"loss", "softmax/mean"}
