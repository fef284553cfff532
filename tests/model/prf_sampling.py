"""TESTS ONLY: samplers whose coins are ``sampling.prf_uniform(key, unit id, step) < q`` — a unit is
in step t's batch or not whichever worker holds it, so one process and two workers train on the
same batches (``tests/model/test_multi_worker.py``). Injected through
``build_training(sampler_factory=prf_sampler(key))``; refused with OS-entropy noise."""
from dpbert.model import sampling


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


def train_with(**kwargs):
    """``train_mlm`` through the builder (which takes the injected ``sampler_factory``)."""
    from dpbert.model.engine.build import build_training, finish

    with build_training(**kwargs) as training:
        training.loop.run()
        return finish(training)
