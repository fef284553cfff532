"""Beam pipeline arguments for the DAG's Beam components when the DAG runs on Vertex AI.

``BeamConfig.pipeline_args()`` is what the local runner uses. In the cloud three more things
matter:

* **No sdist rebuild.** When a Beam component starts, TFX's ``BaseBeamExecutor`` calls
  ``tfx.utils.dependency_utils.make_beam_dependency_flags``: if the Beam args carry none of
  ``--extra_packages``, ``--setup_file``, ``--requirements_file``, ``--sdk_container_image`` (or
  the legacy ``--worker_harness_container_image``) it copies TFX's installed sources, builds an
  sdist of them and adds ``--extra_package=<sdist>``, at *every* Beam component start, whatever
  the runner. The image the Vertex step runs in already holds TFX and dpbert, so every runner
  gets ``--sdk_container_image=IMAGE`` (the same image), which turns that off. DirectRunner
  ignores the flag; DataflowRunner starts its workers from that image (so workers have exactly
  the launcher's Python, Beam and dpbert); the portable runner's Docker environment is given
  the image too (Beam 2.59's ``PortableRunner`` reads the harness image from
  ``--environment_option=docker_container_image=`` / ``--environment_config``, not from
  ``--sdk_container_image``).
* **Required options are checked at compile time**, not an hour later in a Dataflow log:
  DataflowRunner needs ``--project``, ``--region`` and a ``gs://`` ``--temp_location``;
  Flink/Spark/Portable need a ``--job_endpoint``. Errors are ``ConfigError`` naming
  ``beam.extra_args`` (the CLI turns them into exit code 2).
* **Flink and Spark go through a Beam job server** (``PortableRunner --job_endpoint``). Which
  engine runs the job is decided by the job server behind the endpoint, so ``beam.runner:
  FlinkRunner`` / ``SparkRunner`` / ``PortableRunner`` all compile to ``--runner=PortableRunner``
  (this also avoids ``FlinkRunner``'s default of ``--environment_type=LOOPBACK``, which would
  make the Flink workers call back into the Vertex step). The job-service protocol itself is
  tested end to end in ``tests/beam/test_job_service.py`` (Beam's local job service and an
  ``EXTERNAL`` worker pool on loopback); Dataflow, Flink and Spark themselves are not run here.
* **DaskRunner is refused** (``dpbert.config.REFUSED_BEAM_RUNNERS``, exit 2 naming
  ``beam.runner``): Beam 2.59's DaskRunner splits a key's group across partitions
  (apache/beam#29365: per-key counts come back in parts), so the patient cap would keep k tuples
  per part and each part of a word's count would be noised and thresholded on its own: with two
  parts, twice the sensitivity and the threshold's δ the recorded ε was computed for.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from dpbert.config import REFUSED_BEAM_RUNNERS, BeamConfig, Config, ConfigError

#: beam.runner (normalized) -> the Beam runner the Vertex step launches.
_RUNNERS = {
    "direct": "DirectRunner",
    "dataflow": "DataflowRunner",
    "flink": "PortableRunner",
    "spark": "PortableRunner",
    "portable": "PortableRunner",
}

DATAFLOW_REQUIRED = ("project", "region", "temp_location")
PORTABLE_ENVIRONMENTS = ("DOCKER", "EXTERNAL", "PROCESS")


def _normalized_runner(runner: str) -> str:
    key = BeamConfig.runner_key(runner)
    if key in REFUSED_BEAM_RUNNERS:  # BeamConfig.validate refuses it first; a config built in code too
        raise ConfigError(f"beam.runner {REFUSED_BEAM_RUNNERS[key]}, got {runner!r}")
    if key not in _RUNNERS:
        raise ConfigError(
            f"beam.runner {runner!r} is not supported for Vertex AI; use DirectRunner (inside the "
            f"Vertex step), DataflowRunner, or FlinkRunner / SparkRunner / PortableRunner "
            f"(through a Beam job server: --job_endpoint in beam.extra_args)")
    return key


def parse_beam_options(args: List[str]) -> Dict[str, object]:
    """The options explicitly set in ``args`` (Beam's own parser; unknown flags kept)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(list(args)).get_all_options(drop_default=True, retain_unknown_options=True)


def _check_image(image: str):
    if not image or any(c.isspace() for c in image):
        raise ConfigError(f"--image must be a container image reference (REGISTRY/NAME:TAG), got {image!r}")


def _dataflow_args(extra: List[str], options: Dict[str, object], worker_image: str) -> List[str]:
    missing = [f"--{name}" for name in DATAFLOW_REQUIRED if not options.get(name)]
    if missing:
        raise ConfigError(
            f"beam.extra_args must set {', '.join(missing)} for beam.runner=DataflowRunner "
            f"(e.g. --set beam.extra_args=--project=MY_PROJECT,--region=us-central1,"
            f"--temp_location=gs://MY_BUCKET/dataflow/tmp)")
    for name in ("temp_location", "staging_location"):
        value = options.get(name)
        if value and not str(value).startswith("gs://"):
            raise ConfigError(f"beam.extra_args --{name} must be a gs:// path for DataflowRunner, got {value!r}")
    args = ["--runner=DataflowRunner", *extra]
    if not options.get("sdk_container_image") and not options.get("worker_harness_container_image"):
        args.append(f"--sdk_container_image={worker_image}")
    return args


def _environment_option(options: Dict[str, object], key: str) -> Optional[str]:
    for item in options.get("environment_options") or []:
        if item == key:
            return ""
        if item.startswith(key + "="):
            return item.split("=", 1)[1]
    return None


def _portable_args(runner: str, extra: List[str], options: Dict[str, object], worker_image: str) -> List[str]:
    if not options.get("job_endpoint"):
        raise ConfigError(
            f"beam.extra_args must set --job_endpoint=HOST:PORT for beam.runner={runner} on Vertex AI: "
            f"the address of the Flink/Spark Beam job server, reachable from the Vertex step "
            f"(e.g. --set beam.extra_args=--job_endpoint=flink-jobserver.example.internal:8099)")
    env_type = str(options.get("environment_type") or "DOCKER").upper()
    if env_type == "LOOPBACK":
        raise ConfigError(
            "beam.extra_args --environment_type=LOOPBACK runs the workers' code back inside the "
            "Vertex step, which the Flink/Spark workers cannot reach; use DOCKER (default), EXTERNAL "
            "or PROCESS")
    if env_type not in PORTABLE_ENVIRONMENTS:
        raise ConfigError(f"beam.extra_args --environment_type must be one of "
                          f"{', '.join(PORTABLE_ENVIRONMENTS)}, got {options.get('environment_type')!r}")
    args = ["--runner=PortableRunner", *extra]
    if not options.get("environment_type"):
        args.append("--environment_type=DOCKER")
    if env_type == "DOCKER":
        if not options.get("environment_config") and _environment_option(options, "docker_container_image") is None:
            args.append(f"--environment_option=docker_container_image={worker_image}")
    elif env_type == "EXTERNAL":
        if not options.get("environment_config") and _environment_option(options, "external_service_address") is None:
            raise ConfigError(
                "beam.extra_args --environment_type=EXTERNAL needs the SDK worker pool's address: "
                "--environment_config=HOST:PORT (or --environment_option=external_service_address=HOST:PORT)")
    elif env_type == "PROCESS":
        if not options.get("environment_config") and _environment_option(options, "process_command") is None:
            raise ConfigError(
                "beam.extra_args --environment_type=PROCESS needs --environment_option=process_command=... "
                "(or --environment_config)")
    if not options.get("sdk_container_image") and not options.get("worker_harness_container_image"):
        args.append(f"--sdk_container_image={worker_image}")
    return args


def cloud_beam_args(config: Config, image: str) -> List[str]:
    """Beam pipeline args for the DAG compiled for Vertex AI, with ``image`` as the worker image.

    * DirectRunner: ``beam.pipeline_args()`` (runs inside the Vertex step; size the step with
      ``--resources``) + ``--sdk_container_image=IMAGE``.
    * DataflowRunner: ``--runner=DataflowRunner`` + ``beam.extra_args`` (must carry
      ``--project``, ``--region``, ``--temp_location=gs://...``) + ``--sdk_container_image=IMAGE``.
    * FlinkRunner / SparkRunner / PortableRunner: ``--runner=PortableRunner`` + ``beam.extra_args``
      (must carry ``--job_endpoint``) + ``--environment_type=DOCKER`` (unless set) +
      ``--environment_option=docker_container_image=IMAGE`` (for DOCKER, unless set) +
      ``--sdk_container_image=IMAGE``.

    A ``--sdk_container_image`` already in ``beam.extra_args`` is kept (explicit wins), and is
    then also the portable Docker environment's image. ``--runner`` in ``beam.extra_args`` is
    refused (set ``beam.runner``). Raises ``ConfigError`` naming the field to fix.
    """
    _check_image(image)
    beam = config.beam
    kind = _normalized_runner(beam.runner)
    extra = list(beam.extra_args)
    options = parse_beam_options(extra)
    if "runner" in options:
        raise ConfigError(f"beam.extra_args must not set --runner (got {options['runner']!r}); "
                          f"set beam.runner instead")
    worker_image = str(options.get("sdk_container_image") or options.get("worker_harness_container_image") or image)
    if kind == "direct":
        args = list(beam.pipeline_args())
        if not options.get("sdk_container_image") and not options.get("worker_harness_container_image"):
            args.append(f"--sdk_container_image={worker_image}")
        return args
    if kind == "dataflow":
        return _dataflow_args(extra, options, worker_image)
    return _portable_args(beam.runner, extra, options, worker_image)

