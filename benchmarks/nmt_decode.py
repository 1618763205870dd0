"""Caffe2's neural machine translation decoding (seq2seq beam search), real Caffe2 against rnn2jax.

    python benchmarks/nmt_decode.py [--sentences 32] [--beam 6] [--rounds 5] [--units 64] [--quick]
        [--caffe2-python PY] [--out benchmarks/results/nmt_decode.json]

Both sides run Caffe2's own `caffe2.python.models.seq2seq.translate` code, unmodified
(benchmarks/nmt_worker.py): real Caffe2 in its venv, rnn2jax under `rnn2jax exec` with the wheel's sources
as the Caffe2 source tree. The model (an attention LSTM encoder-decoder) is trained by real Caffe2's
`train.py` on a synthetic corpus (each target is its source reversed, word by word translated), and both
decode the same checkpoint and the same sentences (lengths 4 to 10). Before any figure is reported, the two
sides' translations must be equal token for token and their scores within rtol 1e-4; a mismatch raises.

Reported per side: sentences per second, warm (the median of `--rounds` passes over every sentence, after a
first pass) and cold (the first pass, which for rnn2jax includes compiling one executable per sentence
length). The two sides run one after the other, each with `--threads` threads (OMP/MKL for Caffe2,
XLA's intra-op threads for rnn2jax); the 1-minute load average is recorded with each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("nmt_worker.py")
RTOL = 1e-4


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=32, help="sentences decoded per pass")
    parser.add_argument("--beam", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5, help="warm passes per side")
    parser.add_argument("--units", type=int, default=64, help="LSTM units of the encoder and the decoder")
    parser.add_argument("--embedding", type=int, default=32)
    parser.add_argument("--vocabulary", type=int, default=40, help="words per language")
    parser.add_argument("--epochs", type=int, default=6, help="real Caffe2's training of the checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--caffe2-python", default=str(ROOT / ".venv-caffe2" / "bin" / "python"))
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 4 sentences of one length, 1 round, a tiny model"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "nmt_decode.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences, args.rounds, args.units, args.embedding, args.vocabulary, args.epochs = 4, 1, 8, 6, 8, 1
    return args


def _corpus(folder: Path, args: argparse.Namespace) -> dict[str, Path]:
    rng = random.Random(5)
    source = [f"s{i}" for i in range(args.vocabulary)]
    target = [f"t{i}" for i in range(args.vocabulary)]
    paths = {}
    for name, count in (("train", 40 * args.vocabulary), ("eval", 32)):
        sentences = [[rng.choice(source) for _ in range(rng.randint(4, 10))] for _ in range(count)]
        paths[f"{name}.src"] = folder / f"{name}.src"
        paths[f"{name}.tgt"] = folder / f"{name}.tgt"
        paths[f"{name}.src"].write_text("".join(" ".join(s) + "\n" for s in sentences))
        translated = [[target[source.index(w)] for w in reversed(s)] for s in sentences]
        paths[f"{name}.tgt"].write_text("".join(" ".join(s) + "\n" for s in translated))
    lengths = [4] * args.sentences if args.quick else [4 + i % 7 for i in range(args.sentences)]  # quick: 1 compile
    tests = [" ".join(rng.choice(source) for _ in range(length)) for length in lengths]
    paths["test"] = folder / "test.src"
    paths["test"].write_text("".join(s + "\n" for s in tests))
    return paths


def _model_args(args: argparse.Namespace) -> list[str]:
    return [
        "--unk-threshold", "0", "--use-attention",
        "--encoder-cell-num-units", str(args.units), "--encoder-num-layers", "1",
        "--decoder-cell-num-units", str(args.units), "--decoder-num-layers", "1",
        "--encoder-embedding-size", str(args.embedding), "--decoder-embedding-size", str(args.embedding),
    ]  # fmt: skip


def _run(command: list[str], job: dict, folder: Path, name: str, threads: int) -> dict:
    job_path = folder / f"{name}.json"
    job["out"] = str(folder / f"{name}.out.json")
    job["threads"] = threads
    job_path.write_text(json.dumps(job))
    env = dict(os.environ, JAX_PLATFORMS="cpu", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.setdefault("XLA_FLAGS", f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}")
    done = subprocess.run([*command, str(WORKER), str(job_path)], capture_output=True, text=True, env=env, cwd=folder)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(Path(job["out"]).read_text())


def _check_equal(caffe2: list, rnn2jax: list) -> float:
    """The two sides' decodings: equal tokens, scores within RTOL. Returns the largest relative score error."""
    worst = 0.0
    for i, ((want_tokens, want), (got_tokens, got)) in enumerate(zip(caffe2, rnn2jax, strict=True)):
        if got_tokens != want_tokens:
            raise SystemExit(f"sentence {i}: rnn2jax decodes {got_tokens}, real Caffe2 {want_tokens}")
        error = abs(got - want) / max(abs(want), 1e-30)
        if error > RTOL:
            raise SystemExit(f"sentence {i}: rnn2jax's score {got}, real Caffe2's {want}")
        worst = max(worst, error)
    return worst


def main(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    caffe2_python = Path(args.caffe2_python)
    sources = sorted(caffe2_python.parent.parent.glob("lib/python3*/site-packages/caffe2"))
    if not caffe2_python.exists() or not sources:
        raise SystemExit(f"real Caffe2 is needed (the venv of {caffe2_python}): run `rnn2jax setup-caffe2`")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = _corpus(folder, args)
        model = _model_args(args)
        train = [
            "--source-corpus", str(paths["train.src"]), "--target-corpus", str(paths["train.tgt"]),
            "--source-corpus-eval", str(paths["eval.src"]), "--target-corpus-eval", str(paths["eval.tgt"]),
            "--batch-size", "32", "--epochs", str(args.epochs), "--learning-rate", "0.5",
            "--checkpoint", str(folder / "model"), *model,
        ]  # fmt: skip
        started = time.perf_counter()
        _run([str(caffe2_python)], {"mode": "train", "args": train}, folder, "train", args.threads)
        trained_s = time.perf_counter() - started
        decode = {
            "mode": "decode",
            "args": [
                "--source-corpus", str(paths["train.src"]), "--target-corpus", str(paths["train.tgt"]),
                "--beam-size", str(args.beam), "--checkpoint", str(folder / f"model-{args.epochs - 1}"), *model,
            ],
            "sentences": paths["test"].read_text().splitlines(),
            "beam": args.beam,
            "rounds": args.rounds,
        }  # fmt: skip
        sides = {
            "caffe2": [str(caffe2_python)],
            "rnn2jax": [sys.executable, "-m", "rnn2jax", "exec", "--caffe2-source", str(sources[-1])],
        }
        results, loads = {}, {}
        for name, command in sides.items():
            loads[name] = round(os.getloadavg()[0], 2)
            results[name] = _run(command, decode, folder, name, args.threads)
    worst = _check_equal(results["caffe2"]["decoded"], results["rnn2jax"]["decoded"])
    report = {
        "benchmark": "nmt_decode",
        "command": "python benchmarks/nmt_decode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu_count": os.cpu_count(), "platform": sys.platform},
        "threads": args.threads,
        "model": {"units": args.units, "embedding": args.embedding, "vocabulary": args.vocabulary, "beam": args.beam},
        "sentences": args.sentences,
        "checkpoint_training_s": round(trained_s, 2),
        "score_max_rel_error": worst,
        "mean_translation_tokens": statistics.mean(len(t) for t, _ in results["caffe2"]["decoded"]),
        "sides": {},
    }
    for name, result in results.items():
        warm = statistics.median(result["warm_s"])
        report["sides"][name] = {
            "warm_sentences_per_s": args.sentences / warm,
            "cold_sentences_per_s": args.sentences / result["cold_s"],
            "warm_pass_s": result["warm_s"],
            "cold_pass_s": result["cold_s"],
            "loadavg_1min": loads[name],
        }
    sides = report["sides"]
    report["warm_ratio"] = sides["rnn2jax"]["warm_sentences_per_s"] / sides["caffe2"]["warm_sentences_per_s"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return report


def table(report: dict) -> str:
    """The report as Markdown: sentences per second per side, warm and cold, and rnn2jax's warm ratio."""
    model = report["model"]
    lines = [
        f"NMT beam-search decoding (Caffe2 seq2seq translate, attention LSTM, {model['units']} units, beam "
        f"{model['beam']}, {report['sentences']} sentences of 4-10 words, {report['threads']} threads):",
        "",
        "| | sentences/s, warm (median) | sentences/s, first pass | load (1 min) |",
        "|---|--:|--:|--:|",
    ]
    for name, label in (("caffe2", "real Caffe2"), ("rnn2jax", "rnn2jax")):
        side = report["sides"][name]
        lines.append(
            f"| {label} | {side['warm_sentences_per_s']:.1f} | {side['cold_sentences_per_s']:.1f} "
            f"| {side['loadavg_1min']} |"
        )
    lines += ["", f"rnn2jax / real Caffe2, warm: {report['warm_ratio']:.2f}x the sentences per second; "
              f"translations equal (mean {report['mean_translation_tokens']:.1f} tokens with the end token), "
              f"scores within {report['score_max_rel_error']:.1e}."]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
