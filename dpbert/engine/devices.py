"""Devices and ``tf.distribute`` strategies of a training run.

``training.strategy`` default (one device) | mirrored (``MirroredStrategy`` over the first P
devices: GPUs, or logical CPUs made with ``configure_logical_cpus(P)`` BEFORE TensorFlow
initialises its devices — which is how P = 2 is tested on a CPU machine) | tpu
(``TPUClusterResolver(tpu=$TPU_NAME)``; untested here, there is no TPU) | multi_worker
(``MultiWorkerMirroredStrategy`` over the cluster in ``$TF_CONFIG``).
"""
from __future__ import annotations

from os import environ

import tensorflow as tf

from dpbert.mechanism import replicas


def configure_logical_cpus(count: int):
    """Split the first CPU into ``count`` logical devices. Must run before TF initialises devices
    (i.e. before any op runs); raises RuntimeError otherwise."""
    cpus = tf.config.list_physical_devices("CPU")
    existing = tf.config.get_logical_device_configuration(cpus[0])
    if existing is not None and len(existing) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError as err:
        raise RuntimeError(
            f"cannot split the CPU into {count} logical devices after TensorFlow has initialised; "
            f"call configure_logical_cpus({count}) first thing in the process") from err


def mirrored_strategy(replicas: int) -> tf.distribute.MirroredStrategy:
    """``MirroredStrategy`` over the first ``replicas`` GPUs, else logical CPUs.

    On CPUs the all-reduce is ``ReductionToOneDevice``: TF's collective all-reduce keys its
    collective instances per process, and a second MirroredStrategy in the same process (e.g. a
    noise check, then a training run) then fails with a collective shape mismatch.
    """
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) >= replicas:
        return tf.distribute.MirroredStrategy(devices=[d.name for d in gpus[:replicas]])
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < replicas:
        raise ValueError(
            f"mirrored strategy with {replicas} replicas needs {replicas} devices, found {len(cpus)}; "
            f"on a CPU machine call configure_logical_cpus({replicas}) before TensorFlow starts")
    return tf.distribute.MirroredStrategy(devices=[d.name for d in cpus[:replicas]],
                                          cross_device_ops=tf.distribute.ReductionToOneDevice())


def make_strategy(name: str, replicas: int) -> tf.distribute.Strategy:
    if name == "default":
        if replicas != 1:
            raise ValueError(f"training.replicas={replicas} needs training.strategy mirrored or tpu")
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return mirrored_strategy(replicas)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        if strategy.num_replicas_in_sync != replicas:
            raise ValueError(f"TPU has {strategy.num_replicas_in_sync} replicas, config says {replicas}")
        return strategy
    if name == "multi_worker":
        return multi_worker_strategy(replicas)
    raise ValueError(f"unknown strategy {name!r}")


#: This process's ``MultiWorkerMirroredStrategy`` and the ``TF_CONFIG`` it joined (one per process).
_MULTI_WORKER: dict = {}


def multi_worker_strategy(replicas: int) -> tf.distribute.MultiWorkerMirroredStrategy:
    """``MultiWorkerMirroredStrategy`` over the cluster in ``$TF_CONFIG`` (Vertex AI custom jobs and
    Kubeflow's TFJob set it): every process of the job calls this, with the same ``replicas`` = R,
    the replicas of all workers together. Must run before TensorFlow executes its first op in the
    process (the collectives are configured then). Ring all-reduce on CPUs; NCCL picked by TF on GPUs.

    ONE strategy per process, returned again on every later call: a second one re-enables the
    collectives on the live context, which replaces the process's collective manager. A peer whose
    first collective reached the old manager (a worker that started training while the chief was
    still building its strategy) then waits forever and so does the chief: the first variable's
    broadcast hung that way (tests/model/test_multi_worker.py::test_one_strategy_per_process)."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().jobs:
        raise ValueError("training.strategy multi_worker needs the cluster in $TF_CONFIG (set by Vertex AI "
                         "custom jobs and Kubeflow's TFJob; see README 'Scaling out')")
    tf_config = environ.get("TF_CONFIG", "")
    if not _MULTI_WORKER:
        gpus = tf.config.list_physical_devices("GPU")
        implementation = tf.distribute.experimental.CommunicationImplementation.AUTO if gpus else \
            tf.distribute.experimental.CommunicationImplementation.RING
        _MULTI_WORKER.update(tf_config=tf_config, strategy=tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation)))
    elif _MULTI_WORKER["tf_config"] != tf_config:
        raise RuntimeError("this process already joined the cluster of another TF_CONFIG; a process trains in "
                           "one multi-worker cluster")
    strategy = _MULTI_WORKER["strategy"]
    if strategy.num_replicas_in_sync != replicas:
        raise ValueError(f"the TF_CONFIG cluster has {strategy.num_replicas_in_sync} replicas in sync, "
                         f"training.replicas says {replicas}")
    return strategy


def non_chief_worker(training_config, strategy) -> bool:
    """True in a worker process of rank > 0 of a multi-worker job (decided from the given
    strategy, else from ``$TF_CONFIG`` when ``training.strategy`` is multi_worker)."""
    if strategy is not None:
        return replicas.worker_layout(strategy)[1] > 0
    if training_config.strategy != "multi_worker":
        return False
    from tensorflow.python.distribute import multi_worker_util  # pylint: disable=import-outside-toplevel

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    if not spec.jobs or resolver.task_type is None:
        return False
    return multi_worker_util.id_in_cluster(spec, resolver.task_type, resolver.task_id) > 0
