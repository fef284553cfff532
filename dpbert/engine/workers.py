"""The configuration every process of a multi-worker training run trains with.

``training.workers`` = W > 1 makes the run ONE ``MultiWorkerMirroredStrategy`` cluster of W
processes, each running the same trainer code on the same inputs with its own ``TF_CONFIG``
(rank 0 is the chief: the only one that locks and writes the state directory). Starting and
supervising the processes is ``dpbert.launch`` (which knows nothing of training); what a lost
worker cost is read from the chain's step log (``dpbert.engine.chain.read_step_log``).
"""
from __future__ import annotations

import dataclasses


def process_config(training_config):
    """The ``TrainingConfig`` every process of a run with ``training.workers`` = W trains with: W = 1
    is the configuration itself; W > 1 is ``strategy: multi_worker`` over W × ``replicas`` replicas
    (replicas = the devices of one worker). The plan's P (micro-batches B / (P·T)) is then the
    cluster's replica count, which ``multi_worker_strategy`` checks against the cluster it joins."""
    workers = int(training_config.workers)
    if workers == 1:
        return training_config
    return dataclasses.replace(training_config, strategy="multi_worker",
                               replicas=workers * int(training_config.replicas))
