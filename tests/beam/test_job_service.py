"""The vocabulary job through a Beam job service (issue 25 item 4), and DaskRunner refused.

``beam.runner: PortableRunner`` with ``--job_endpoint`` and an ``EXTERNAL`` SDK worker pool is the
protocol Flink and Spark job servers speak. Here both ends are Beam 2.59's own Python servers,
started on loopback for the test: ``apache_beam.runners.portability.local_job_service_main``
(the job service; it runs the pipeline with Beam's FnApiRunner) and
``apache_beam.runners.worker.worker_pool_main`` (the worker pool: every SDK worker is a separate
``python`` process it starts). The vocabulary stage's job (``dp_vocabulary`` →
``dpbert.vocab.beam_histogram.run_histogram_job``) must give the same EXACT (noise-off:
``vocab.non_private``) per-word tuple counts there as on the DirectRunner, with the patient cap
too (its ``Top.PerKey`` over string patient ids is the shuffle DaskRunner gets wrong); the DP
path (noise from OS entropy on the SDK worker) runs there and releases a valid noisy histogram.
"""
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from dpbert.config import BeamConfig, ConfigError, CorpusConfig, PrivacyConfig, SyntheticCorpusConfig, \
    VocabConfig, load_config
from dpbert.stages.vocabulary import HISTOGRAM_FILE, dp_vocabulary
from dpbert.vocab.histogram_file import read_histogram

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10
TUPLE_WORDS = 32


# ----------------------------------------------------------------------------- the job service

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("localhost", port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen):
    """Stop ``process`` and everything it started (its own session: the worker pool's SDK workers)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):  # the session's leftovers (SDK workers), then a reap
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)


@contextlib.contextmanager
def local_job_service(workdir):
    """Beam's local job service and an EXTERNAL worker pool on loopback; yields the Beam options
    ``--job_endpoint=localhost:P --environment_type=EXTERNAL --environment_config=localhost:Q``.

    The job service stages into ``workdir/staging`` and writes its port to ``workdir/job.port``
    (port 0: the service picks a free one, no race); the worker pool gets a free port. Both run
    in their own session and are killed with everything they started on exit, also when the
    body raises. Logs: ``workdir/*.log``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # The worker pool starts each SDK worker as `python -c ...` from PATH: this interpreter's.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    port_file = workdir / "job.port"
    pool_port = _free_port()
    commands = {
        "job_service": [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                        "--port=0", f"--port_file={port_file}", f"--staging_dir={workdir / 'staging'}"],
        "worker_pool": [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                        f"--service_port={pool_port}"],
    }
    processes = {}
    try:
        for name, command in commands.items():
            with open(workdir / f"{name}.log", "wb") as log:
                processes[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and _listening(pool_port)):
            for name, process in processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}; see {workdir / (name + '.log')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job service / worker pool did not start in {START_TIMEOUT_S} s; "
                                   f"see {workdir}/*.log")
            time.sleep(0.1)
        job_port = int(port_file.read_text())
        yield [f"--job_endpoint=localhost:{job_port}", "--environment_type=EXTERNAL",
               f"--environment_config=localhost:{pool_port}"]
    finally:
        for process in processes.values():
            _stop(process)


# ----------------------------------------------------------------------------- helpers

def _per_word(pairs):
    """``{word: count}`` of a histogram file's pairs; a word listed twice (a count split in parts,
    as DaskRunner returns them, apache/beam#29365) fails: ``dict()`` alone would hide it."""
    counts = dict(pairs)
    repeated = sorted(w for w, n in collections.Counter(w for w, _ in pairs).items() if n > 1)
    assert not repeated, f"{len(repeated)} word(s) listed more than once (split counts)"
    return counts


def _pipeline(args):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    return beam.Pipeline(options=PipelineOptions(list(args)))


def _histogram(args, tuples_dir, out_dir, vocab, privacy):
    dp_vocabulary(_pipeline(args), str(tuples_dir), str(out_dir), vocab, privacy, tuple_words=TUPLE_WORDS)
    return read_histogram(str(out_dir / HISTOGRAM_FILE))


@pytest.fixture(scope="module")
def tuples_dir(tmp_path_factory):
    """The fixed corpus: synthetic notes of 6 patients cut into 32-word tuples, 3 shards."""
    from dpbert.stages.ingest import ingest

    path = tmp_path_factory.mktemp("corpus") / "tuples"
    corpus = CorpusConfig(synthetic=SyntheticCorpusConfig(patients=6, admissions_per_patient=1, notes_per_admission=2,
                                                          seed=11))
    ingest(corpus, str(path), tuple_words=TUPLE_WORDS, num_shards=3, unit="patient")
    return path


# ----------------------------------------------------------------------------- the job service run

@pytest.mark.e2e
@pytest.mark.slow  # make test-slow (CI): a job-service subprocess; the job itself runs in process in test_dp_histogram.py
@pytest.mark.timeout(240)
def test_vocabulary_job_through_a_beam_job_service(tmp_path, tuples_dir):
    from dpbert.data.tfrecord import read_tuples
    from dpbert.data.tuples import distinct_words

    truth = collections.Counter()
    for t in read_tuples(str(tuples_dir)):
        truth.update(distinct_words(t))
    direct = BeamConfig(direct_running_mode="in_memory", direct_num_workers=1).pipeline_args()
    tuple_unit = PrivacyConfig(tuple_words=TUPLE_WORDS)
    patient_unit = PrivacyConfig(tuple_words=TUPLE_WORDS, unit="patient", max_tuples_per_patient=2)
    exact = VocabConfig(non_private=True, size=60)
    exact_capped = VocabConfig(non_private=True, size=60, noise_seed=5)  # the cap's choice seeded (test only)
    dp = VocabConfig(sigma=0.5, delta=1e-3, size=60)  # production RNG: OS entropy on the SDK worker

    reference = _per_word(_histogram(direct, tuples_dir, tmp_path / "direct", exact, tuple_unit))
    reference_capped = _per_word(_histogram(direct, tuples_dir, tmp_path / "direct_cap", exact_capped, patient_unit))
    assert reference == dict(truth)
    assert sum(reference_capped.values()) < sum(reference.values())  # the cap removed tuples

    started = time.monotonic()
    with local_job_service(tmp_path / "service") as service_args:
        portable = BeamConfig(runner="PortableRunner", extra_args=service_args).pipeline_args()
        assert portable[0] == "--runner=PortableRunner"
        through_service = _per_word(_histogram(portable, tuples_dir, tmp_path / "portable", exact, tuple_unit))
        capped = _per_word(_histogram(portable, tuples_dir, tmp_path / "portable_cap", exact_capped, patient_unit))
        out = dp_vocabulary(_pipeline(portable), str(tuples_dir), str(tmp_path / "portable_dp"), dp, tuple_unit,
                            tuple_words=TUPLE_WORDS)
        noisy = read_histogram(str(tmp_path / "portable_dp" / HISTOGRAM_FILE))
        jobs = sorted(os.listdir(tmp_path / "service" / "staging"))
    elapsed = time.monotonic() - started

    # Every run went through the job service (one staging folder per job) and its worker pool.
    assert len(jobs) == 3, jobs
    assert "Starting worker with command" in (tmp_path / "service" / "worker_pool.log").read_text()
    # The same exact per-word tuple counts as the DirectRunner (and as a brute-force count).
    assert through_service == reference
    assert capped == reference_capped
    # The DP path: a valid noisy histogram of the same words.
    props = out.properties
    threshold, sigma = props["threshold"], props["sigma"]
    released = _per_word(noisy)
    assert 0 < props["epsilon"] < float("inf") and props["non_private"] is False
    assert released and set(released) <= set(truth)
    assert all(count >= threshold and not float(count).is_integer() for count in released.values())
    assert all(abs(count - truth[word]) < 6 * sigma for word, count in released.items())
    assert {w for w, n in truth.items() if n >= threshold + 6 * sigma} <= set(released)
    assert released != {w: float(n) for w, n in truth.items() if w in released}
    print(f"job service: 3 jobs in {elapsed:.1f} s (start-up included)")


def test_split_counts_fail_the_comparison():
    """Positive control for the check above: a histogram with one word's count in two parts (what
    DaskRunner returns, apache/beam#29365) is caught, though its dict() equals the true counts'."""
    true = [("pain", 5), ("fever", 3)]
    split = [("pain", 5), ("fever", 1), ("fever", 2)]
    assert _per_word(true) == {"pain": 5, "fever": 3}
    with pytest.raises(AssertionError, match="split counts"):
        _per_word(split)


def test_the_job_service_is_stopped_when_the_body_fails(tmp_path):
    """Both servers (and anything they started) are gone after an exception inside the block."""
    with pytest.raises(RuntimeError, match="body failed"):
        with local_job_service(tmp_path) as args:
            ports = [int(a.rsplit(":", 1)[1]) for a in args if a.startswith(("--job_endpoint", "--environment_config"))]
            assert all(_listening(p) for p in ports)
            raise RuntimeError("body failed")
    assert not any(_listening(p) for p in ports)


# ----------------------------------------------------------------------------- DaskRunner refused

@pytest.mark.parametrize("override", [
    "beam.runner=DaskRunner",
    "beam.runner=apache_beam.runners.dask.dask_runner.DaskRunner",
    "beam.extra_args=--runner=DaskRunner",
    "beam.extra_args=--runner,dask",
])
def test_dask_runner_is_refused(override):
    with pytest.raises(ConfigError, match=r"beam\.(runner|extra_args --runner) is refused.*apache/beam#29365"):
        load_config(None, [override])


def test_dask_runner_refused_for_the_cloud_too():
    """A config built in code (not validated) reaches kubeflow.beam_args: refused there too."""
    from kubeflow.beam_args import cloud_beam_args

    config = load_config()
    config.beam.runner = "DaskRunner"
    with pytest.raises(ConfigError, match=r"beam\.runner is refused.*29365"):
        cloud_beam_args(config, "registry.example/dpbert:1")


def test_dpbert_run_with_dask_exits_2_naming_beam_runner(tmp_path, capsys, monkeypatch):
    """``dpbert run --set beam.runner=DaskRunner``: one exit-2 line naming beam.runner, before the
    DAG starts or anything is written."""
    import types

    from dpbert import exit_codes
    from dpbert_cli.main import main

    fake = types.ModuleType("pipeline.local_runner")

    class _Never(Exception):
        pass

    def run_local(config):
        raise AssertionError("the DAG started")

    fake.run_local, fake.RunInterrupted, fake.RunRefused = run_local, _Never, _Never
    monkeypatch.setitem(sys.modules, "pipeline.local_runner", fake)
    output = tmp_path / "out"
    code = main(["run", "--output", str(output), "--set", "beam.runner=DaskRunner"])
    err = capsys.readouterr().err
    assert code == exit_codes.BAD_INPUT
    assert "Traceback" not in err and "beam.runner" in err and "apache/beam#29365" in err
    assert not output.exists()
