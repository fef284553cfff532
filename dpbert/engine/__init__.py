"""The training engine: one reusable DP-SGD loop (``loop.TrainLoop``) over a batch source
(``source``), a DP-SGD stepper and a training chain (``chain``: the private state directory on
``dpbert.storage``), with hooks (``hooks``); ``build.build_training`` composes them for
``dpbert.engine.train.train_mlm``, the white-box audit, the noise check and the benchmarks.

Which DP mechanism runs is decided by the composed objects alone: one Gaussian draw per logical
batch after the per-unit clipped SUM (``dpbert.mechanism``), units Poisson-sampled at the plan's
q (or shuffled), every executed step counted in the step log before it runs.

Also here: ``train`` (``train_mlm``: checkpoints, step ledger, TensorBoard, SavedModel), ``masking``
(15% masking, keyed per example), ``optimizers`` and ``public_warmup`` (a public warm-up before the
private run).
"""
