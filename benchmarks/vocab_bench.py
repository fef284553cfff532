"""DP vocabulary stage: the Beam histogram job and WordPiece-from-counts, against their baselines.

    python benchmarks/vocab_bench.py [--words 10000000] [--corpus synthetic|zipf] [--repeats 2]

Corpus: the synthetic clinical generator (``dpbert.data.synthetic``, streamed until ``--words``
words) or a seeded Zipf corpus (numpy), cut into tuples of N = 256 words and written as the
ingestion component writes them (8 gzipped TFRecord shards of tf.train.Example).

Measured (each Beam run and each baseline in its own process, for its own peak memory):
- beam: ``run_dp_histogram`` on the DirectRunner, multi_processing, 2 workers, end to end (read
  the shards, count, noise, write the JSONL), best of ``--repeats``; and the same job on a tiny
  input (its fixed cost: worker start-up, stages) to estimate the steady-state rate.
- counter_in_memory: one process, ``Counter.update(set(words))`` over the tuples already in memory
  as lists of str (the brief's baseline; no I/O, no decoding).
- counter_from_files: one process reading the same shards with ``dpbert.data.tfrecord.read_tuples``
  and counting the same way (the end-to-end single-process alternative).
- ratios: words/s of beam ÷ words/s of each baseline (goal ≥ 1.0); and the Beam job on
  ``--scale-copies`` × the input (the shards linked k times; the Counter is linear in the input,
  so its words/s is the same) to amortize the fixed cost.
- wordpiece: ``train_wordpiece`` on the noisy histogram (automatic count scale) vs the same
  tokenizer trained on the raw tuple text (goal: ratio ≤ 1.0); the scale decision measured on the
  most informative DP histogram: unscaled vs scaled training time and vocabulary agreement, with
  two unscaled runs as the noise floor (the trainer breaks ties arbitrarily).
- survivors: words released and the vocabulary size (target 30000) for σ = 200, δ = 1e-9,
  N = 256 with the correct threshold C = 1 + σΦ⁻¹(1 − δ/N) and the paper's
  C = 1 + σ·erf⁻¹(1 − δ/N), and the same for a smaller σ (``--small-sigma``).

Prints one JSON document. The machine is shared: compare figures from the same run.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N = 256
DELTA = 1e-9
SIGMA = 200.0
BEAM_ARGS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _maxrss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited across fork + exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _TreeMemorySampler:
    """Samples the RSS of this process and all its descendants (the Beam SDK workers) every
    ``interval`` seconds; keeps the peak of the sum and the peak of the largest worker."""

    def __init__(self, interval: float = 0.05):
        import threading

        import psutil

        self._psutil = psutil
        self._interval = interval
        self._stop = threading.Event()
        self.peak_total_mb = 0.0
        self.peak_worker_mb = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        me = self._psutil.Process()
        while not self._stop.is_set():
            try:
                rss = [me.memory_info().rss]
                workers = []
                for child in me.children(recursive=True):
                    try:
                        workers.append(child.memory_info().rss)
                    except self._psutil.Error:
                        pass
                total = (sum(rss) + sum(workers)) / 2 ** 20
                self.peak_total_mb = max(self.peak_total_mb, total)
                if workers:
                    self.peak_worker_mb = max(self.peak_worker_mb, max(workers) / 2 ** 20)
            except self._psutil.Error:
                pass
            self._stop.wait(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- corpus

def synthetic_tuples(words: int, seed: int = 1234):
    from dpbert.data.synthetic import generate_notes
    from dpbert.data.tuples import document_tuples

    total = 0
    for document in generate_notes(patients=10 ** 7, admissions_per_patient=2, notes_per_admission=2, seed=seed):
        for t in document_tuples(document, N):
            total += len(t.words)
            yield t
        if total >= words:
            return


def zipf_tuples(words: int, seed: int = 1234, vocab: int = 200_000, exponent: float = 1.1):
    import numpy as np

    from dpbert.data.tuples import WordTuple

    rng = np.random.default_rng(seed)
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
    ids = rng.choice(vocab, size=words, p=p / p.sum())
    lengths = rng.integers(2, 12, size=vocab)
    letters = rng.integers(0, 26, size=(vocab, 12))
    names = ["".join(chr(97 + c) for c in letters[i, :lengths[i]]) for i in range(vocab)]
    for k, start in enumerate(range(0, words, N)):
        yield WordTuple(doc_id=f"z{k // 8}", index=k % 8, words=tuple(names[i] for i in ids[start:start + N]),
                        patient_id=f"P{k // 32}")


# ----------------------------------------------------------------------------- child processes

def _child_beam(source: str, output: str, sigma: float, threshold: float) -> dict:
    from dpbert.vocab.beam_histogram import run_dp_histogram

    with _TreeMemorySampler() as memory:
        start = time.perf_counter()
        result = run_dp_histogram(source, output, sigma, threshold, beam_args=BEAM_ARGS)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "tuples": result.tuples_counted, "words_released": result.words_released,
            "driver_peak_mb": _maxrss_mb(), "largest_worker_peak_mb": memory.peak_worker_mb,
            "job_peak_mb_driver_plus_workers": memory.peak_total_mb}


def _child_counter_from_files(source: str) -> dict:
    from dpbert.data.tfrecord import read_tuples

    start = time.perf_counter()
    counts = collections.Counter()
    words = 0
    for t in read_tuples(source):
        counts.update(set(t.words))
        words += len(t.words)
    return {"seconds": time.perf_counter() - start, "words": words, "peak_mb": _maxrss_mb()}


def _run_child(*args: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- parts

def _threshold(sigma: float, mode: str) -> float:
    from dpbert.privacy.histogram import threshold_for

    return threshold_for(sigma, DELTA, N, mode=mode)


def _vocab_agreement(a, b) -> float:
    va, vb = set(a.get_vocab()), set(b.get_vocab())
    return len(va & vb) / max(len(va), 1)


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=10_000_000)
    parser.add_argument("--corpus", choices=("synthetic", "zipf"), default="synthetic")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--small-sigma", type=float, default=10.0)
    parser.add_argument("--vocab-size", type=int, default=30000)
    parser.add_argument("--scale-copies", type=int, default=4,
                        help="also run the Beam job on the shards linked this many times")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)

    from dpbert.data.tfrecord import write_tuples
    from dpbert.vocab.histogram_file import read_histogram
    from dpbert.vocab.wordpiece import (_new_tokenizer, _trainer, choose_count_scale, train_wordpiece)

    work = Path(tempfile.mkdtemp(prefix="vocab_bench_"))
    report = {"corpus": args.corpus, "tuple_words": N, "beam_args": BEAM_ARGS, "cpus": os.cpu_count(),
              "load_average_at_start": os.getloadavg()}
    try:
        # Corpus → tuples in memory (lists of str) and on disk (the ingestion format).
        start = time.perf_counter()
        gen = synthetic_tuples(args.words) if args.corpus == "synthetic" else zipf_tuples(args.words)
        tuples = list(gen)
        report["generate_seconds"] = time.perf_counter() - start
        total_words = sum(len(t.words) for t in tuples)
        report.update({"words": total_words, "tuples": len(tuples)})
        source = str(work / "tuples")
        _, report["write_tfrecord_seconds"] = _timed(write_tuples, tuples, source, 8)

        report["corpus_in_memory_peak_mb"] = _maxrss_mb()
        # Baseline 1: Counter over the tuples in memory.
        lists = [list(t.words) for t in tuples]
        best = float("inf")
        for _ in range(max(1, args.repeats)):
            start = time.perf_counter()
            exact = collections.Counter()
            for words in lists:
                exact.update(set(words))
            best = min(best, time.perf_counter() - start)
        counter_mem = {"seconds": best, "words_per_s": total_words / best}
        report["distinct_words_exact"] = len(exact)  # synthetic corpus: a public figure here

        # Baseline 2: Counter reading the same files in one process.
        counter_files = _run_child("counter_from_files", source)
        counter_files["words_per_s"] = total_words / counter_files["seconds"]

        # The Beam job (σ = 200, correct threshold), best of repeats; its fixed cost on a tiny input.
        tiny_source = str(work / "tiny")
        write_tuples(tuples[:50], tiny_source, 2)
        fixed = min((_run_child("beam", tiny_source, str(work / "tiny.jsonl"), str(SIGMA), "1.0")
                     for _ in range(max(1, args.repeats))), key=lambda r: r["seconds"])
        runs = []
        for i in range(max(1, args.repeats)):
            runs.append(_run_child("beam", source, str(work / f"dp_correct_{i}.jsonl"), str(SIGMA),
                                   repr(_threshold(SIGMA, "correct"))))
        beam = min(runs, key=lambda r: r["seconds"])
        beam["words_per_s"] = total_words / beam["seconds"]
        beam["all_seconds"] = [r["seconds"] for r in runs]
        beam["fixed_cost_seconds_tiny_input"] = fixed["seconds"]
        beam["fixed_cost_peaks_mb"] = {"driver": fixed["driver_peak_mb"], "worker": fixed["largest_worker_peak_mb"],
                                       "job": fixed["job_peak_mb_driver_plus_workers"]}
        steady = beam["seconds"] - fixed["seconds"]
        # Only meaningful when the input is large enough for the variable part to dominate.
        beam["steady_state_words_per_s"] = total_words / steady if steady > 0.5 else None
        # The same job on k× the input (the shards linked k times): the fixed cost amortized.
        scaled = None
        if args.scale_copies > 1:
            big = work / "tuples_x"
            big.mkdir()
            for k in range(args.scale_copies):
                for shard in sorted(Path(source).iterdir()):
                    os.symlink(shard, big / shard.name.replace("tuples-", f"tuples-c{k}-"))
            scaled_runs = [_run_child("beam", str(big), str(work / f"dp_x_{i}.jsonl"), str(SIGMA),
                                      repr(_threshold(SIGMA, "correct"))) for i in range(max(1, args.repeats))]
            scaled = min(scaled_runs, key=lambda r: r["seconds"])
            scaled.update({"copies": args.scale_copies, "words": total_words * args.scale_copies,
                           "all_seconds": [r["seconds"] for r in scaled_runs],
                           "words_per_s": total_words * args.scale_copies / scaled["seconds"]})
            scaled["ratio_vs_counter_in_memory"] = scaled["words_per_s"] / counter_mem["words_per_s"]
        report["histogram"] = {
            "beam_on_copies": scaled,
            "beam": beam,
            "counter_in_memory": counter_mem,
            "counter_from_files": counter_files,
            "ratio_vs_counter_in_memory": beam["words_per_s"] / counter_mem["words_per_s"],
            "ratio_vs_counter_from_files": beam["words_per_s"] / counter_files["words_per_s"],
            "steady_state_ratio_vs_counter_in_memory": (beam["steady_state_words_per_s"] / counter_mem["words_per_s"]
                                                        if beam["steady_state_words_per_s"] else None),
        }

        # Survivors and vocabulary sizes, four settings (each a real Beam run).
        histograms = {}
        survivors = {}
        for sigma in (SIGMA, args.small_sigma):
            for mode in ("correct", "paper"):
                threshold = _threshold(sigma, mode)
                name = f"sigma={sigma:g},{mode}"
                if sigma == SIGMA and mode == "correct":
                    best_run = runs.index(beam)
                    path, run = str(work / f"dp_correct_{best_run}.jsonl"), beam
                else:
                    path = str(work / f"dp_{sigma:g}_{mode}.jsonl")
                    run = _run_child("beam", source, path, str(sigma), repr(threshold))
                hist = read_histogram(path)
                histograms[name] = hist
                entry = {"sigma": sigma, "threshold_mode": mode, "threshold": threshold,
                         "words_released": len(hist), "beam_seconds": run["seconds"]}
                if hist:
                    tok, seconds = _timed(train_wordpiece, hist, vocab_size=args.vocab_size)
                    entry.update({"vocab_size": tok.get_vocab_size(), "wordpiece_seconds": seconds,
                                  "count_scale": choose_count_scale([c for _, c in hist])})
                else:
                    entry.update({"vocab_size": 0, "note": "no word survived: no vocabulary"})
                survivors[name] = entry
        report["survivors"] = survivors

        # WordPiece: noisy histogram vs raw text, and the count-scale decision.
        informative = max(histograms, key=lambda k: len(histograms[k]))
        hist = histograms[informative]
        texts = [" ".join(words) for words in lists]
        raw_tok = _new_tokenizer()
        _, raw_seconds = _timed(raw_tok.train_from_iterator, texts, _trainer(args.vocab_size, 1, None),
                                length=len(texts))
        import numpy as np

        counts = np.asarray([c for _, c in hist])
        auto, auto_seconds = _timed(train_wordpiece, hist, vocab_size=args.vocab_size)
        unscaled_a, unscaled_seconds = _timed(train_wordpiece, hist, vocab_size=args.vocab_size, count_scale=1.0)
        unscaled_b = train_wordpiece(hist, vocab_size=args.vocab_size, count_scale=1.0)
        smallest = float(counts.min())
        scales = {}
        for target in (50, 6, 3, 1):
            s = min(1.0, target / smallest)
            tok, seconds = _timed(train_wordpiece, hist, vocab_size=args.vocab_size, count_scale=s)
            scales[f"smallest_scaled_count={target}"] = {
                "count_scale": s, "copies_fed": int(np.maximum(1, np.rint(counts * s)).sum()),
                "seconds": seconds, "vocab_agreement_with_unscaled": _vocab_agreement(tok, unscaled_a)}
        exact_hist = list(exact.items())
        exact_tok, exact_seconds = _timed(train_wordpiece, exact_hist, vocab_size=args.vocab_size)
        report["wordpiece"] = {
            "histogram": informative,
            "histogram_words": len(hist),
            "raw_text_seconds": raw_seconds,
            "raw_text_words": total_words,
            "noisy_histogram_seconds_auto_scale": auto_seconds,
            "auto_count_scale": choose_count_scale(counts),
            "ratio_noisy_histogram_vs_raw_text": auto_seconds / raw_seconds,
            "noisy_histogram_vocab_size": auto.get_vocab_size(),
            "unscaled_seconds": unscaled_seconds,
            "unscaled_copies_fed": int(np.rint(counts).sum()),
            "vocab_agreement_two_unscaled_runs": _vocab_agreement(unscaled_b, unscaled_a),
            "vocab_agreement_auto_vs_unscaled": _vocab_agreement(auto, unscaled_a),
            "scales": scales,
            "exact_histogram_seconds_non_private": exact_seconds,
            "exact_histogram_copies_fed": int(sum(exact.values())),
            "exact_histogram_vocab_size": exact_tok.get_vocab_size(),
        }
        report["benchmark_peak_mb"] = _maxrss_mb()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            report["work_dir"] = str(work)
    print(json.dumps(report, indent=2, default=float))
    return report


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "beam":
            out = _child_beam(rest[0], rest[1], float(rest[2]), float(rest[3]))
        elif kind == "counter_from_files":
            out = _child_counter_from_files(rest[0])
        else:
            raise SystemExit(f"unknown child {kind}")
        print(json.dumps(out))
    else:
        main()
