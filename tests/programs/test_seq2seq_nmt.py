"""Caffe2's neural machine translation, unmodified: seq2seq `train.py` and `translate.py` (beam search).

Both scripts come from the real-Caffe2 wheel's `caffe2/python/models/seq2seq/` and run twice, on real
Caffe2 and under `rnn2jax exec` with that wheel's sources as the Caffe2 source tree, through
seq2seq_driver.py (which calls each script's `main()` and records losses and decodings):
- training from the same initial parameters (Caffe2 draws them, rnn2jax is fed them) gives the same loss
  at every step and the same checkpoint;
- decoding a checkpoint with beam sizes 1, 3 and 6 gives the same translations, token for token, and
  the same scores. The checkpoint is trained longer on real Caffe2 alone, so that the beams hold
  different hypotheses and the translations are not all the end token.

Every sentence has the same length, so each side compiles one training shape and one decoding shape.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rnn2jax.storage import read_blobs

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("seq2seq_driver.py")
CAFFE2_PYTHON = Path(os.environ.get("RNN2JAX_CAFFE2_PYTHON", ROOT / ".venv-caffe2" / "bin" / "python"))
CAFFE2_SOURCE = next(iter(sorted(CAFFE2_PYTHON.parent.parent.glob("lib/python3*/site-packages/caffe2"))), None)
RTOL = 1e-5

pytestmark = pytest.mark.skipif(
    CAFFE2_SOURCE is None or not (CAFFE2_SOURCE / "python" / "models" / "seq2seq" / "train.py").is_file(),
    reason=f"real-Caffe2 venv (with its seq2seq sources) missing: {CAFFE2_PYTHON}",
)

MODEL = [
    "--unk-threshold", "0",
    "--encoder-cell-num-units", "8", "--encoder-num-layers", "1",
    "--decoder-cell-num-units", "8", "--decoder-num-layers", "1",
    "--encoder-embedding-size", "6", "--decoder-embedding-size", "6",
    "--use-attention",
]  # fmt: skip
SOURCE_WORDS, TARGET_WORDS = list("abcdefgh"), list("stuvwxyz")


def _corpus(folder: Path, name: str, count: int, rng: random.Random) -> tuple[Path, Path]:
    """`count` sentence pairs of 4 words: the target is the source reversed, word by word translated."""
    sources = [[rng.choice(SOURCE_WORDS) for _ in range(4)] for _ in range(count)]
    targets = [[TARGET_WORDS[SOURCE_WORDS.index(w)] for w in reversed(s)] for s in sources]
    paths = folder / f"{name}.src", folder / f"{name}.tgt"
    for path, sentences in zip(paths, (sources, targets), strict=True):
        path.write_text("".join(" ".join(s) + "\n" for s in sentences))
    return paths


def _drive(caffe2: bool, folder: Path, record: str, init: str, mode: str, script: str, args: list[str]):
    if caffe2:
        command = [str(CAFFE2_PYTHON), str(DRIVER)]
    else:
        command = [sys.executable, "-m", "rnn2jax", "exec", "--caffe2-source", str(CAFFE2_SOURCE), str(DRIVER)]
    command += [str(folder / record), str(folder / init), mode, script, *args]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env, cwd=folder)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-3000:]}"
    return json.loads((folder / record).read_text()), done.stdout


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("nmt")
    rng = random.Random(11)
    train = _corpus(folder, "train", 16, rng)
    evaluation = _corpus(folder, "eval", 4, rng)
    tests = [" ".join(rng.choice(SOURCE_WORDS) for _ in range(4)) for _ in range(3)]
    (folder / "test.src").write_text("".join(f"{sentence}\n" for sentence in tests))
    (folder / "train_args.json").write_text(json.dumps([
        "--source-corpus", str(train[0]), "--target-corpus", str(train[1]),
        "--source-corpus-eval", str(evaluation[0]), "--target-corpus-eval", str(evaluation[1]),
        "--batch-size", "4", *MODEL,
    ]))  # fmt: skip
    return folder


def _train_args(corpus: Path, epochs: int, checkpoint: str) -> list[str]:
    args = json.loads((corpus / "train_args.json").read_text())
    return [*args, "--epochs", str(epochs), "--learning-rate", "0.5", "--checkpoint", str(corpus / checkpoint)]


def test_train_py_gives_caffe2s_losses_and_checkpoint(corpus):
    want, _ = _drive(True, corpus, "caffe2_train.json", "init.npz", "dump", "train", _train_args(corpus, 2, "caffe2"))
    got, _ = _drive(False, corpus, "rnn2jax_train.json", "init.npz", "load", "train", _train_args(corpus, 2, "rnn2jax"))
    assert len(want["losses"]) == 2 * (4 + 1)  # 4 training and 1 evaluation batch per epoch
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=RTOL)
    for epoch in range(2):
        ours = read_blobs(corpus / f"rnn2jax-{epoch}")
        theirs = read_blobs(corpus / f"caffe2-{epoch}")
        assert sorted(ours) == sorted(theirs) and len(theirs) > 10
        for name, value in theirs.items():
            assert ours[name].dtype == value.dtype and ours[name].shape == value.shape, name
            np.testing.assert_allclose(ours[name], value, rtol=RTOL, atol=1e-6, err_msg=name)
    with np.load(corpus / "init.npz") as initial:  # the parameters did move
        assert np.abs(theirs["encoder_embeddings"] - initial["encoder_embeddings"]).max() > 1e-3


@pytest.fixture(scope="module")
def checkpoint(corpus) -> Path:
    """A checkpoint trained for 60 epochs on real Caffe2, whose decodings are real translations."""
    _drive(True, corpus, "long_train.json", "unused", "none", "train", _train_args(corpus, 60, "long"))
    return corpus / "long-59"


def test_translate_py_gives_caffe2s_translations_and_scores_with_beams_1_3_and_6(corpus, checkpoint):
    """translate.py's main() once per beam size, in one process per side (the driver's --beam-sizes)."""
    args = ["--beam-sizes", "1,3,6", "--sentences", str(corpus / "test.src")]
    args += ["--source-corpus", str(corpus / "train.src"), "--target-corpus", str(corpus / "train.tgt"), *MODEL]
    args += ["--checkpoint", str(checkpoint)]
    want, want_text = _drive(True, corpus, "caffe2_translate.json", "unused", "none", "translate", args)
    got, got_text = _drive(False, corpus, "rnn2jax_translate.json", "unused", "none", "translate", args)
    assert got_text.splitlines() == want_text.splitlines()
    assert [line for line in want_text.splitlines() if line.startswith("===")] == [f"=== beam {b}" for b in (1, 3, 6)]
    assert sorted(want["decoded"]) == ["1", "3", "6"]
    for beam, decoded in want["decoded"].items():
        assert len(decoded) == 3 and any(len(tokens) > 1 for tokens, _ in decoded), beam
        ours = got["decoded"][beam]
        assert [tokens for tokens, _ in ours] == [tokens for tokens, _ in decoded], beam
        np.testing.assert_allclose([s for _, s in ours], [s for _, s in decoded], rtol=RTOL, err_msg=beam)
    # the comparison covers beams that search differently: their decodings are not all the same
    assert len({json.dumps(decoded) for decoded in want["decoded"].values()}) > 1
