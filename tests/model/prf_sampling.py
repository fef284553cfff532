"""TESTS ONLY: samplers whose coins are ``sampling.prf_uniform(key, unit id, step) < q`` — a unit is
in step t's batch or not whichever worker holds it, so one process and two workers train on the
same batches (``tests/model/test_multi_worker.py``). Injected through
``build_training(hooks=RunHooks(sampler_factory=prf_sampler(key)))``; refused with OS-entropy noise."""
from dpbert.mechanism import sampling


def prf_sampler(key: int):
    def factory(spec):
        if spec.seed is None:
            raise ValueError("the PRF sampler is for tests only (with training.noise_seed)")
        if spec.mode == "patient":
            return sampling.PatientPoissonSampler(spec.groups, spec.q, spec.k, spec.choice_key, seed=spec.seed,
                                                  shard=spec.shard, prf_key=key)
        if spec.mode == "poisson":
            return sampling.PoissonSampler(spec.units, spec.q, seed=spec.seed, shard=spec.shard, prf_key=key,
                                           prf_ids=spec.unit_ids)
        raise ValueError(f"no PRF sampler for {spec.mode} sampling")

    return factory


def train_with(*, token_ids, special_token_ids, vocab_size, model_config, training_config, output_dir,
               sampler_factory, plan=None, example_ids=None, patient_keys=None, progress=True,
               export_saved_model=None, strategy=None):
    """``train_mlm`` through the builder (which takes the injected ``sampler_factory``)."""
    from dpbert.engine.build import ChainOutputs, ModelStart, RunHooks, TrainingRows, build_training, finish

    with build_training(TrainingRows(token_ids, special_token_ids, example_ids=example_ids, patient_keys=patient_keys),
                        ModelStart(model_config, vocab_size), training_config,
                        ChainOutputs(output_dir, progress=progress, export_saved_model=export_saved_model), plan,
                        hooks=RunHooks(sampler_factory=sampler_factory), strategy=strategy) as training:
        training.loop.run()
        return finish(training)
