"""Beam args for the cloud (kubeflow/beam_args.py): runner options, required-option checks, and
no TFX sdist rebuild at Beam component start."""
import pytest

from dpbert.config import ConfigError, load_config
from kubeflow.beam_args import cloud_beam_args, parse_beam_options

IMAGE = "europe-west4-docker.pkg.dev/my-project/dpbert/dpbert:abc123"
DATAFLOW_EXTRA = "--project=my-project,--region=europe-west4,--temp_location=gs://my-bucket/tmp"


def _args(*overrides, image=IMAGE):
    return cloud_beam_args(load_config(None, list(overrides)), image)


VALID = {
    "direct": (),
    "direct-in-memory": ("beam.direct_running_mode=in_memory", "beam.direct_num_workers=1"),
    "dataflow": ("beam.runner=DataflowRunner", f"beam.extra_args={DATAFLOW_EXTRA}"),
    "dataflow-own-image": ("beam.runner=DataflowRunner",
                           f"beam.extra_args={DATAFLOW_EXTRA},--sdk_container_image=gcr.io/p/worker:1"),
    "flink": ("beam.runner=FlinkRunner", "beam.extra_args=--job_endpoint=flink-js:8099"),
    "spark-external": ("beam.runner=SparkRunner",
                       "beam.extra_args=--job_endpoint=spark-js:8099,--environment_type=EXTERNAL,"
                       "--environment_config=localhost:50000"),
    "portable-process": ("beam.runner=PortableRunner",
                         "beam.extra_args=--job_endpoint=js:8099,--environment_type=PROCESS,"
                         "--environment_option=process_command=/opt/apache/beam/boot"),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_no_tfx_sdist_rebuild_for_any_runner(name, monkeypatch):
    """TFX's BaseBeamExecutor passes the Beam args through make_beam_dependency_flags at every
    Beam component start; with ours it must return them unchanged without building anything."""
    from tfx.utils import dependency_utils

    def build_ephemeral_package():
        raise AssertionError("TFX would rebuild its sdist with these Beam args")

    monkeypatch.setattr(dependency_utils, "build_ephemeral_package", build_ephemeral_package)
    args = _args(*VALID[name])
    assert dependency_utils.make_beam_dependency_flags(list(args)) == args


def test_without_our_flag_tfx_would_rebuild_its_sdist(monkeypatch):
    """The control: the local runner's args make TFX build an sdist at each Beam component start."""
    from tfx.utils import dependency_utils

    built = []
    monkeypatch.setattr(dependency_utils, "build_ephemeral_package", lambda: built.append(1) or "/tmp/tfx.tar.gz")
    args = load_config().beam.pipeline_args()
    assert dependency_utils.make_beam_dependency_flags(args) == args + ["--extra_package=/tmp/tfx.tar.gz"]
    assert built == [1]


def test_direct_runner_runs_in_the_step_with_the_image_flag():
    args = _args("beam.direct_num_workers=3")
    assert args == ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=3",
                    f"--sdk_container_image={IMAGE}"]


def test_direct_runner_ignores_the_image_flag():
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    args = _args("beam.direct_running_mode=in_memory", "beam.direct_num_workers=1")
    with beam.Pipeline(argv=args) as p:
        assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2), equal_to([2, 4, 6]))


def test_dataflow_gets_project_region_temp_location_and_the_image():
    args = _args(*VALID["dataflow"])
    assert args == ["--runner=DataflowRunner", "--project=my-project", "--region=europe-west4",
                    "--temp_location=gs://my-bucket/tmp", f"--sdk_container_image={IMAGE}"]
    options = parse_beam_options(args)
    assert options["sdk_container_image"] == IMAGE and options["runner"] == "DataflowRunner"


def test_an_explicit_worker_image_wins():
    args = _args(*VALID["dataflow-own-image"])
    assert [a for a in args if "container_image" in a] == ["--sdk_container_image=gcr.io/p/worker:1"]


@pytest.mark.parametrize("extra, missing", [
    ("", "--project, --region, --temp_location"),
    ("--project=p", "--region, --temp_location"),
    ("--project=p,--region=r", "--temp_location"),
    ("--region=r,--temp_location=gs://b/t", "--project"),
])
def test_dataflow_names_the_missing_options_and_the_field(extra, missing):
    overrides = ["beam.runner=DataflowRunner"] + ([f"beam.extra_args={extra}"] if extra else [])
    with pytest.raises(ConfigError) as err:
        _args(*overrides)
    assert f"beam.extra_args must set {missing} for beam.runner=DataflowRunner" in str(err.value)


def test_dataflow_temp_location_must_be_on_cloud_storage():
    with pytest.raises(ConfigError, match="--temp_location must be a gs:// path"):
        _args("beam.runner=DataflowRunner", "beam.extra_args=--project=p,--region=r,--temp_location=/tmp/x")


def test_two_token_options_are_understood():
    config = load_config(None, ["beam.runner=DataflowRunner"])
    config.beam.extra_args = ["--project", "p", "--region", "r", "--temp_location", "gs://b/t"]
    assert cloud_beam_args(config, IMAGE)[-1] == f"--sdk_container_image={IMAGE}"


@pytest.mark.parametrize("runner", ["FlinkRunner", "SparkRunner", "PortableRunner"])
def test_flink_and_spark_go_through_a_job_endpoint_with_the_image_as_docker_environment(runner):
    args = _args(f"beam.runner={runner}", "beam.extra_args=--job_endpoint=jobserver:8099")
    assert args == ["--runner=PortableRunner", "--job_endpoint=jobserver:8099", "--environment_type=DOCKER",
                    f"--environment_option=docker_container_image={IMAGE}", f"--sdk_container_image={IMAGE}"]


def test_the_docker_environment_is_what_beam_starts_the_workers_from():
    from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions
    from apache_beam.transforms import environments

    args = _args(*VALID["flink"])
    environment = environments.Environment.from_options(PipelineOptions(args).view_as(PortableOptions))
    assert isinstance(environment, environments.DockerEnvironment) and environment.container_image == IMAGE


def test_external_and_process_environments_are_kept():
    args = _args(*VALID["spark-external"])
    assert "--environment_type=EXTERNAL" in args and "--environment_config=localhost:50000" in args
    assert not any(a.startswith("--environment_option=docker") for a in args)
    assert args[-1] == f"--sdk_container_image={IMAGE}"


@pytest.mark.parametrize("overrides, needle", [
    (("beam.runner=FlinkRunner",), "beam.extra_args must set --job_endpoint"),
    (("beam.runner=SparkRunner", "beam.extra_args=--job_endpoint=j:1,--environment_type=LOOPBACK"), "LOOPBACK"),
    (("beam.runner=FlinkRunner", "beam.extra_args=--job_endpoint=j:1,--environment_type=EXTERNAL"),
     "--environment_config"),
    (("beam.runner=FlinkRunner", "beam.extra_args=--job_endpoint=j:1,--environment_type=PROCESS"),
     "process_command"),
    (("beam.runner=FlinkRunner", "beam.extra_args=--job_endpoint=j:1,--environment_type=FOO"),
     "--environment_type must be one of"),
    (("beam.runner=PrismRunner",), "beam.runner 'PrismRunner' is not supported"),
    (("beam.extra_args=--runner=DataflowRunner",), "must not set --runner"),
])
def test_refusals_name_the_field(overrides, needle):
    with pytest.raises(ConfigError) as err:
        _args(*overrides)
    assert needle in str(err.value)


@pytest.mark.parametrize("image", ["", "two words"])
def test_the_image_must_be_a_reference(image):
    with pytest.raises(ConfigError, match="--image"):
        _args(image=image)


def test_every_step_of_the_compiled_spec_carries_the_beam_args(compile_spec):
    from tests.kubeflow.conftest import DATAFLOW
    from tests.kubeflow.conftest import IMAGE as SPEC_IMAGE

    spec = compile_spec(DATAFLOW)
    expected = cloud_beam_args(load_config(None, DATAFLOW), SPEC_IMAGE)
    for executor in spec["pipelineSpec"]["deploymentSpec"]["executors"].values():
        args = executor["container"]["args"]
        assert args[-len(expected):] == expected
