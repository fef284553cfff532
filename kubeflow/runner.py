"""Compile the dpbert DAG for Vertex AI Pipelines (a KFP v2 PipelineJob JSON), offline.

    dpbert compile --target vertex --output pipeline.json --image IMAGE \
        --pipeline-root gs://BUCKET/ROOT [--config FILE] [--set section.field=value ...] \
        [--resources COMPONENT_ID:cpu=8,memory=32,accelerator=NVIDIA_TESLA_T4,accelerator_count=1]

(also ``python -m kubeflow.runner compile ...``). The DAG is whatever
``pipeline.pipeline.create_pipeline`` returns for the configuration, with no local ML Metadata
store (Vertex brings its own) and the Beam args of ``kubeflow.beam_args.cloud_beam_args``.
Nothing is contacted: the compiler only writes the file. See docs/running-on-vertex.md.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Optional

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from dpbert import exit_codes  # noqa: E402
from dpbert import storage  # noqa: E402
from dpbert.config import Config, ConfigError, load_config  # noqa: E402
from kubeflow.beam_args import cloud_beam_args  # noqa: E402
from kubeflow.custom_job import vertex_region  # noqa: E402
from kubeflow.resources import ResourcesArg, apply_resources, parse_resources  # noqa: E402

TARGETS = ("vertex",)

#: Vertex AI / KFP pipeline names (tfx/orchestration/kubeflow/v2/pipeline_builder.py).
_PIPELINE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")


def validate_for_vertex(config: Config, pipeline_root: str) -> None:
    """Refuse, with the field to fix, what compiles but cannot run on Vertex AI."""
    if not _PIPELINE_NAME.fullmatch(config.pipeline.name):
        raise ConfigError(f"pipeline.name must match [a-z0-9][a-z0-9-]{{0,127}} for Vertex AI "
                          f"(lower case, digits and -), got {config.pipeline.name!r}")
    if not (pipeline_root or "").startswith("gs://") or len(pipeline_root.rstrip("/")) <= len("gs://"):
        raise ConfigError(f"--pipeline-root must be a Cloud Storage URI gs://BUCKET/ROOT for Vertex AI, "
                          f"got {pipeline_root!r}")
    if config.training.workers > 1 and not config.vertex.project:
        raise ConfigError("vertex.project must be set with training.workers > 1: the trainer step runs a "
                          "Vertex AI custom job in that project (and in vertex.region)")
    from dpbert.ledger.identity import remote_ledger_problem

    problem = remote_ledger_problem(config)
    if problem:
        raise ConfigError(problem)
    path = config.corpus.path
    if path is not None:
        if path.startswith("gs://"):
            # dpbert.data.readers opens corpus files with open()/pathlib, which cannot read gs://.
            raise ConfigError(
                f"corpus.path {path!r}: the corpus readers open local files; on Vertex AI read the "
                f"bucket through its Cloud Storage FUSE mount: corpus.path=/gcs/{path[len('gs://'):]}")
        if not path.startswith("/gcs/"):
            raise ConfigError(
                f"corpus.path {path!r} is a path on this machine, which the Vertex AI step cannot see; "
                f"upload the corpus to Cloud Storage and use its FUSE path /gcs/BUCKET/PATH")


def compile_vertex(config: Config, output: str, image: str, pipeline_root: str,
                   resources: Optional[ResourcesArg] = None, display_name: Optional[str] = None,
                   cuda_image: Optional[str] = None) -> str:
    """Compile ``create_pipeline(config, pipeline_root)`` to a Vertex AI PipelineJob file.

    ``output`` ending in ``.json`` gets the PipelineJob JSON (``pipelineSpec`` + ``runtimeConfig``
    with ``gcsOutputDirectory = pipeline_root``; what ``aiplatform.PipelineJob(template_path=...)``
    and the REST ``pipelineJobs.create`` take); ``.yaml``/``.yml`` gets the bare PipelineSpec.
    Every component runs ``image``, except that trainer steps with a GPU run ``cuda_image``
    (``trainer_image``). ``resources``: component id -> ResourceSpec (or a dict of
    ``kubeflow.resources.resource_spec`` keywords). Returns the absolute path written.

    After writing, every executor class and custom artifact type the spec names is imported
    here (as the V2 container entrypoint will in the image): ``ImportError`` if one does not.
    """
    from tfx import v1 as tfx
    from tfx.orchestration.kubeflow.v2 import pipeline_builder

    from kubeflow.spec_check import check_spec_importable, load_spec
    from pipeline.pipeline import create_pipeline

    validate_for_vertex(config, pipeline_root)
    beam_args = cloud_beam_args(config, image)
    dag = create_pipeline(config, pipeline_root, metadata_path=None, beam_pipeline_args=beam_args,
                          fingerprint_corpus=False)
    if resources:
        apply_resources(dag, resources)
    trainer = trainer_image(config, image, cuda_image, resources)
    attach_custom_job(dag, config, trainer, vertex_region(config, image) if config.training.workers > 1 else None)
    attach_pipeline_root(dag, pipeline_root)
    output = os.path.abspath(output)
    images = image if trainer == image else dict({pipeline_builder.DEFAULT_IMAGE_PATH_KEY: image},
                                                 **{i: trainer for i in TRAINER_IDS})
    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(
            default_image=images, display_name=display_name or config.pipeline.name),
        output_dir=os.path.dirname(output),
        output_filename=os.path.basename(output),
    )
    runner.run(dag, write_out=True)
    spec = load_spec(output)
    if uncache_corpus_ingest(spec, config):
        _write_spec(spec, output)
    check_spec_importable(spec)
    return output


#: The trainer components (``pipeline.pipeline.create_components``): their steps submit the custom job.
TRAINER_IDS = ("MLMPretrainer", "MLMPretrainerNonPrivate")


def _has_accelerator(spec) -> bool:
    if spec is None:
        return False
    return bool(spec.get("accelerator") if isinstance(spec, dict) else spec.accelerator.type)


def trainer_image(config: Config, image: str, cuda_image: Optional[str],
                  resources: Optional[ResourcesArg] = None) -> str:
    """The image of the trainer steps (and of their custom job's replicas): ``cuda_image`` (built
    from kubeflow/Dockerfile.cuda) when they get a GPU — ``vertex.accelerator_type``, or an
    accelerator in ``resources`` for a trainer component — else ``image``. A GPU without
    ``cuda_image`` keeps ``image`` with a warning: the CPU image's TensorFlow does not use it."""
    gpu = bool(config.vertex.accelerator_type) or any(_has_accelerator((resources or {}).get(i)) for i in TRAINER_IDS)
    if not gpu:
        return image
    if not cuda_image:
        print("dpbert compile: warning: the trainer steps get a GPU but no --cuda-image (an image built from "
              "kubeflow/Dockerfile.cuda) was given; the CPU image's TensorFlow will not use the GPU", file=sys.stderr)
        return image
    return cuda_image


def attach_custom_job(dag, config: Config, image: str, region: Optional[str] = None) -> Optional[dict]:
    """With ``training.workers`` > 1, give each trainer component the Vertex AI CustomJob template
    (``kubeflow.custom_job.build_custom_job``, in ``region``) as its ``custom_job`` parameter: its
    step then runs the training as a custom job of W replicas. Returns the template (None with one
    worker)."""
    if config.training.workers < 2:
        return None
    import json

    from kubeflow.custom_job import build_custom_job

    template = build_custom_job(config, image, region)
    for component in dag.components:
        if component.id in TRAINER_IDS:
            component.exec_properties["custom_job"] = json.dumps(template, sort_keys=True)
    return template


def attach_pipeline_root(dag, pipeline_root: str) -> None:
    """Give each trainer component the pipeline root as its ``pipeline_root`` parameter (its state
    lives under it): the PipelineJob's ``gcsOutputDirectory``, which no Vertex AI step is told, and
    which its output URIs (``ROOT/<project>/<job>/<task>_<id>/<key>``) do not show at a fixed
    depth. The rehearsal (``kubeflow.local_v2``) replaces it with its own folder."""
    for component in dag.components:
        if component.id in TRAINER_IDS:
            component.exec_properties["pipeline_root"] = pipeline_root


#: The task that reads the corpus (``pipeline.pipeline.ingest_component``).
INGEST_TASK = "CorpusIngest"


def uncache_corpus_ingest(spec: dict, config: Config) -> bool:
    """Turn Vertex AI's cache off for CorpusIngest when it reads a corpus path; True if changed.

    How Vertex AI sees a corpus changed in place: it does not need to. Its cache key is the
    task's parameters and inputs, and CorpusIngest's input is a path: the only parameter that
    would follow the content is a fingerprint of it, and a spec carries none (an unkeyed hash in
    a PipelineJob is an oracle for the corpus; the key lives in the operator's private state,
    which the compiling machine need not have). So CorpusIngest re-reads the corpus on every
    submission; its new WordTuples artifact is a new input downstream (KFP's cache key names the
    input artifacts), so the DAG re-runs: on Vertex AI a re-submission is a new run, never a
    stale one. The synthetic corpus is a function of the spec's own parameters: still cached.
    """
    if config.corpus.path is None:
        return False
    from kubeflow.spec_check import pipeline_spec

    task = pipeline_spec(spec)["root"]["dag"]["tasks"].get(INGEST_TASK)
    if task is None:
        raise ValueError(f"the compiled spec has no {INGEST_TASK} task")
    task.pop("cachingOptions", None)
    return True


def _write_spec(spec: dict, output: str) -> None:
    import json

    import yaml

    text = json.dumps(spec, indent=2, sort_keys=True) if output.endswith(".json") else \
        yaml.safe_dump(spec, sort_keys=True)
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(text + ("\n" if output.endswith(".json") else ""))


def planned_budget_problem(config: Config) -> Optional[str]:
    """The budget guard for a compile: a message if the planned ε exceeds the budget, else None.

    The plan needs the unit's public size (``training.dataset_size`` for tuples,
    ``training.dataset_patients`` for patients): the corpus is not readable from here.
    """
    if config.privacy.epsilon_budget is None:
        return None
    from pipeline import guard

    if config.corpus.path is not None and guard.public_dataset_size(config) is None:
        field = "dataset_patients" if config.privacy.unit == "patient" else "dataset_size"
        raise ConfigError(
            f"training.{field} must be set to compile with privacy.epsilon_budget (privacy.unit = "
            f"{config.privacy.unit}): the budget is checked before anything runs, and the corpus "
            f"(corpus.path) is not readable from here")

    ledger = guard.planned(config)
    try:  # the dataset's budget gate over its ledger, when this machine can read it
        dataset = guard.dataset_budget(config, ledger, None)
    except storage.CredentialsMissing:
        dataset = None  # offline: the run's own reservation asks the same gate before anything reads the data
    if dataset is not None:
        ledger["dataset"], ledger["within_budget"] = dataset, dataset["within_budget"]
    if ledger is not None and not ledger["within_budget"]:
        return guard.over_budget_message(ledger)
    return None


# --- command line -------------------------------------------------------------------------------

def add_compile_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``compile`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "compile", help="compile the DAG for Vertex AI Pipelines (offline)",
        description="Compile the DAG to a Vertex AI PipelineJob JSON (KFP v2). Offline: nothing is "
                    "contacted. See docs/running-on-vertex.md.")
    p.add_argument("--target", choices=TARGETS, default="vertex", help="orchestrator (default: vertex)")
    p.add_argument("--output", required=True, help="file to write: .json (PipelineJob) or .yaml (PipelineSpec)")
    p.add_argument("--image", required=True,
                   help="container image every step (and the Dataflow/portable Beam workers) runs, "
                        "built from kubeflow/Dockerfile, e.g. REGION-docker.pkg.dev/PROJECT/REPO/dpbert:TAG")
    p.add_argument("--cuda-image", dest="cuda_image",
                   help="image of the trainer steps when they get a GPU (vertex.accelerator_type, or "
                        "--resources MLMPretrainer:accelerator=...), built from kubeflow/Dockerfile.cuda")
    p.add_argument("--pipeline-root", required=True, dest="pipeline_root",
                   help="gs://BUCKET/ROOT where Vertex AI writes the artifacts")
    p.add_argument("--config", help="YAML configuration file (default: the built-in demo preset, "
                                    "dpbert/configs/demo.yaml, as every dpbert command)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one configuration value (repeatable), e.g. --set beam.runner=DataflowRunner")
    p.add_argument("--resources", action="append", default=[], metavar="COMPONENT_ID:KEY=VALUE,...",
                   help="machine resources of one step (repeatable): cpu (vCPUs), memory (GB), "
                        "accelerator (e.g. NVIDIA_TESLA_T4), accelerator_count")
    p.add_argument("--display-name", dest="display_name", help="Vertex AI display name (default: pipeline.name)")
    p.set_defaults(func=cmd_compile)
    return p


def cmd_compile(args) -> int:
    """``dpbert compile``: 0 written; 2 bad input (ConfigError raised to the caller); 3 over budget."""
    config = load_config(args.config, list(args.overrides), preset=None if args.config else "demo")
    resources = dict(parse_resources(text) for text in args.resources)
    region = vertex_region(config, args.image)
    problem = planned_budget_problem(config)
    if problem is not None:
        print(problem, file=sys.stderr)
        return exit_codes.OVER_BUDGET
    path = compile_vertex(config, args.output, args.image, args.pipeline_root, resources=resources,
                          display_name=args.display_name, cuda_image=args.cuda_image)
    print(f"compiled {config.pipeline.name} for {args.target}: {path}")
    print(compile_summary(config, args, region, resources))
    print(f"submit it in {region} with google.cloud.aiplatform.PipelineJob(template_path=...).submit() "
          f"(docs/running-on-vertex.md, section 5)")
    return exit_codes.OK


# --- the summary a compile ends with ------------------------------------------------------------

def planned_line(config: Config) -> str:
    """The planned ε per unit (``pipeline.guard.planned``) when a public size is configured."""
    from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
    from pipeline import guard

    unit = config.privacy.unit
    if config.training.non_private:
        return "  planned ε: none planned (training.non_private: the model is not differentially private)"
    if guard.public_dataset_size(config) is None:
        field = "dataset_patients" if unit == "patient" else "dataset_size"
        return (f"  planned ε per {unit}: not planned (training.{field} is unset: the trainer plans "
                f"from a DP count of its units)")
    ledger = guard.planned(config)
    return (f"  planned ε per {unit}: ε_total (PLD) = {fmt_epsilon(ledger['epsilon_total_pld'])} at δ = "
            f"{fmt_delta(ledger['delta'])} (vocabulary ε_V = {fmt_epsilon(ledger['epsilon_vocab'])}, training "
            f"ε_T = {fmt_epsilon(ledger['epsilon_train'])}, each at its own δ; n = {ledger['dataset_size']} "
            f"{unit}s, {ledger['steps']} steps)")


def ledger_lines(config: Config) -> List[str]:
    """Where the dataset's ledger is, and what it still admits (``guard.remaining_budget``) when
    this machine can read it."""
    from dpbert.ledger import identity
    from dpbert.privacy.numbers import fmt_delta, fmt_epsilon
    from pipeline import guard

    dataset_id = identity.dataset_id_for(config.corpus)
    if dataset_id is None:
        return ["  ledger: none (no corpus.dataset_id and no budget)"]
    where = identity.ledger_uri(identity.location_for(config), dataset_id)
    if config.corpus.path is None:
        where += " (public synthetic corpus: on Vertex AI the step's own disk)"
    try:
        left = guard.remaining_budget(config)
    except storage.CredentialsMissing:
        return [f"  ledger: {where}", "  ledger admits: ledger not read (no credentials)"]
    if left is None:
        admits = "no budget configured or pinned for this dataset"
    else:
        admits = (f"{'at least ' if left['at_least'] else ''}{left['steps']} DP-SGD steps of this plan "
                  f"({left['planned_steps']} planned; a run of {left['steps']} steps: ε_T = "
                  f"{fmt_epsilon(left['epsilon_train'])} at δ = {fmt_delta(left['delta_train'])})")
    return [f"  ledger: {where}", f"  ledger admits: {admits}"]


def machine_line(config: Config, resources: dict) -> str:
    """The trainer's custom job machines (``training.workers`` > 1) and the sized steps."""
    vertex, parts = config.vertex, []
    if config.training.workers > 1:
        accelerator = f" + {vertex.accelerator_count} × {vertex.accelerator_type}" if vertex.accelerator_type else ""
        parts.append(f"trainer custom job {config.training.workers} × {vertex.machine_type}{accelerator}")
    for component_id, spec in sorted(resources.items()):
        sized = [f"cpu={spec.cpu_limit:g}" if spec.cpu_limit else "", f"memory={spec.memory_limit:g}GB"
                 if spec.memory_limit else "", f"{spec.accelerator.count} × {spec.accelerator.type}"
                 if spec.accelerator.type else ""]
        parts.append(f"{component_id} {', '.join(filter(None, sized))}")
    parts.append(f"{'every other' if parts else 'every'} step: Vertex AI's default machine (size it with --resources)")
    return "  machines: " + "; ".join(parts)


def compile_summary(config: Config, args, region: str, resources: dict) -> str:
    """What the compiled pipeline will run: planned ε, the dataset ledger, region, machines,
    image(s) and pipeline root."""
    source = "vertex.region" if config.vertex.region else "from the image's Artifact Registry host"
    lines = ["summary:", planned_line(config), *ledger_lines(config), f"  region: {region} ({source})",
             machine_line(config, resources), f"  image: {args.image}"]
    if args.cuda_image:
        lines.append(f"  trainer image with a GPU: {args.cuda_image}")
    lines.append(f"  pipeline root: {args.pipeline_root}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m kubeflow.runner compile ...`` (same as ``dpbert compile``)."""
    parser = argparse.ArgumentParser(prog="python -m kubeflow.runner")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_compile_parser(sub)
    args = parser.parse_args(argv)
    from dpbert.data.readers import CorpusError

    try:
        return args.func(args)
    except (ConfigError, CorpusError) as err:
        print(f"dpbert {args.command}: error: {err}", file=sys.stderr)
        return exit_codes.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
