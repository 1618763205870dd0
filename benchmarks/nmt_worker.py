"""One side of benchmarks/nmt_decode.py: Caffe2's seq2seq modules, unmodified, under real Caffe2 or rnn2jax.

    .venv-caffe2/bin/python benchmarks/nmt_worker.py JOB.json            (real Caffe2)
    rnn2jax exec benchmarks/nmt_worker.py JOB.json                       (rnn2jax)

JOB.json: {"mode": "train" | "decode", "args": [...], "out": FILE, "sentences": [...], "beam": K,
"rounds": R, "threads": N}.
- train: runs `caffe2.python.models.seq2seq.train.main()` with `args` (what `python train.py ARGS` runs).
- decode: builds translate.py's `Seq2SeqModelCaffe2EnsembleDecoder` as its `run_seq2seq_beam_decoder` does
  (same vocabularies, same model parameters, the checkpoint in `args`), then decodes every sentence once
  (cold: rnn2jax compiles each new sentence length here) and R more times (warm), timing each pass, and
  writes the decodings and the times to `out`.
Python 3.9 compatible, and only NumPy and caffe2 imported: real Caffe2 runs it too.
"""

import json
import os
import sys
import time


def _decode(job):
    from caffe2.python.models.seq2seq import seq2seq_util, translate

    parser_args = job["args"]
    sys.argv = ["translate.py", *parser_args]
    captured = {}

    def capture(args, model_params, decoding_params):
        captured.update(args=args, model_params=model_params, decoding_params=decoding_params)

    translate.run_seq2seq_beam_decoder = capture
    translate.main()  # parses the arguments and builds model_params as translate.py does
    args = captured["args"]
    source_vocab = seq2seq_util.gen_vocab(args.source_corpus, args.unk_threshold)
    target_vocab = seq2seq_util.gen_vocab(args.target_corpus, args.unk_threshold)
    decoder = translate.Seq2SeqModelCaffe2EnsembleDecoder(
        translate_params=dict(
            ensemble_models=[
                dict(
                    source_vocab=source_vocab,
                    target_vocab=target_vocab,
                    model_params=captured["model_params"],
                    model_file=args.checkpoint,
                )
            ],
            decoding_params=captured["decoding_params"],
        ),
    )
    decoder.load_models()
    numerized = [seq2seq_util.get_numberized_sentence(s, source_vocab) for s in job["sentences"]]

    def one_pass():
        start = time.perf_counter()
        decoded = []
        for sentence in numerized:
            tokens, _, score = decoder.decode(sentence, 2 * len(sentence) + 5)
            decoded.append([[int(t) for t in tokens], float(score)])
        return time.perf_counter() - start, decoded

    cold, decoded = one_pass()
    warm = []
    for _ in range(job["rounds"]):
        seconds, again = one_pass()
        if [d[0] for d in again] != [d[0] for d in decoded]:
            raise SystemExit("a warm pass decoded differently from the first")
        warm.append(seconds)
    return {"decoded": decoded, "cold_s": cold, "warm_s": warm}


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    threads = str(job.get("threads", 2))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, threads)
    if job["mode"] == "train":
        from caffe2.python.models.seq2seq import train

        sys.argv = ["train.py", *job["args"]]
        train.main()
        result = {}
    else:
        result = _decode(job)
    with open(job["out"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
