import pytest

from dpbert.config import ConfigError, load_config


def test_defaults_and_presets_validate():
    assert load_config().vocab.sigma == 200.0
    demo = load_config(preset="demo")
    assert demo.corpus.path is None and demo.pipeline.name == "dpbert-demo"
    assert load_config(preset="default").training.replicas == 256


@pytest.mark.parametrize("override,field", [
    ("vocab.sigma=0", "vocab.sigma"),
    ("vocab.sigma=-1", "vocab.sigma"),
    ("vocab.delta=0", "vocab.delta"),
    ("vocab.delta=1", "vocab.delta"),
    ("training.delta=1.5", "training.delta"),
    ("privacy.tuple_words=0", "privacy.tuple_words"),
    ("training.noise_multiplier=-1", "training.noise_multiplier"),
    ("training.clip_norm=0", "training.clip_norm"),
    ("training.steps=0", "training.steps"),
    ("training.sampling=random", "training.sampling"),
    ("training.batch_size=30", "training.batch_size"),  # not divisible by replicas × accumulation
    ("privacy.epsilon_budget=-2", "privacy.epsilon_budget"),
    ("vocab.threshold_mode=erf", "vocab.threshold_mode"),
    ("vocab.sigma=abc", "vocab.sigma"),
    ("training.steps=1.5", "training.steps"),
    ("vocab.colour=red", "vocab.colour"),
    ("membership.holdout_patient_fraction=1", "membership.holdout_patient_fraction"),
    ("training.holdout_patient_fraction=0.3", "training.holdout_patient_fraction"),  # moved to membership
])
def test_invalid_values_name_the_field(override, field):
    overrides = [override]
    if field == "training.batch_size":
        overrides += ["training.accumulation_steps=4"]
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    assert field in str(err.value)


def test_file_plus_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("vocab:\n  sigma: 50\ntraining:\n  steps: 10\n")
    config = load_config(str(path), ["training.steps=20", "corpus.path=/x.csv"])
    assert config.vocab.sigma == 50.0 and config.training.steps == 20 and config.corpus.path == "/x.csv"


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("vocab:\n  sigma: [1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: not valid YAML"):
        load_config(str(bad))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("vocab:\n  sigma: -3\n")
    with pytest.raises(ConfigError, match="vocab.sigma"):
        load_config(str(wrong))


def test_non_private_baseline_refused_with_a_budget():
    with pytest.raises(ConfigError, match="vocab.non_private"):
        load_config(overrides=["vocab.non_private=true", "privacy.epsilon_budget=8"])


def test_sections_reach_components_as_validated_json():
    """section_to_json / section_from_json: the one path of configuration into a component."""
    from dpbert.config import (MembershipConfig, TrainingConfig, section_from_json, section_name,
                               section_to_json)

    demo = load_config(preset="demo")
    assert demo.membership.holdout_patient_fraction == 0.3
    assert section_from_json(TrainingConfig, section_to_json(demo.training)) == demo.training
    holdout = section_from_json(MembershipConfig, section_to_json(demo.membership, MembershipConfig.HOLDOUT_FIELDS))
    assert holdout == MembershipConfig(holdout_patient_fraction=0.3)  # the other fields at their defaults
    assert section_name(MembershipConfig) == "membership"
    with pytest.raises(ConfigError, match="training.batch_size must be >= 1"):
        section_from_json(TrainingConfig, '{"batch_size": 0}')
    with pytest.raises(ConfigError, match="training.colour is not a configuration field"):
        section_from_json(TrainingConfig, '{"colour": 1}')
    with pytest.raises(ConfigError, match="training: not valid JSON"):
        section_from_json(TrainingConfig, "{")


def test_errors_name_their_source_override_or_file_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(preset="demo", overrides=["vocab.sigma=abc"])
    assert str(err.value).startswith("--set vocab.sigma=abc: vocab.sigma must be a number")
    assert "demo.yaml" not in str(err.value)
    path = tmp_path / "c.yaml"
    path.write_text("vocab:\n  sigma: 3\ntraining:\n  steps: abc\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:4: training\.steps must be an integer"):
        load_config(str(path))
    # an override replaces the file's value and takes the blame for its own field only
    with pytest.raises(ConfigError, match=r"^--set training\.colour=1: training\.colour is not"):
        load_config(str(path), ["training.steps=4", "training.colour=1"])
    with pytest.raises(ConfigError, match=r"^--set nope: override 'nope' must look like"):
        load_config(str(path), ["nope"])


@pytest.mark.parametrize("text, match", [
    ("vocab:\n  sigma: 3\ntraining:\n  steps: 2\nvocab:\n  size: 100\n", r"c\.yaml:5: duplicate key 'vocab' \(first at line 1\)"),
    ("vocab:\n  sigma: 3\n  sigma: 4\n", r"c\.yaml:3: duplicate key 'vocab\.sigma'"),
    ("- a\n", r"c\.yaml:1: the top level must be a mapping"),
])
def test_duplicate_keys_and_bad_shapes_are_refused_with_file_line(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(str(path))


def test_undecodable_file_and_directory_are_named(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("vocab:\n  sigma: 3\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml:3: not UTF-8 text"):
        load_config(str(path))
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory"):
        load_config(str(tmp_path))


def _section_fields(cls):
    import dataclasses

    return {f.name for f in dataclasses.fields(cls)}


def test_training_is_its_typed_sections_and_each_section_checks_only_its_own_fields():
    """Each field of ``training`` is defined (default and check) in one section or at run level;
    a section's check runs on the section alone, so it reads no other section's field."""
    import dataclasses

    from dpbert import config

    sections = [_section_fields(cls) for cls in config.TRAINING_SECTIONS]
    assert sum(map(len, sections)) == len(set().union(*sections))  # disjoint
    run_level = _section_fields(config.TrainingConfig) - set().union(*sections)
    assert run_level == {"mask_probability", "checkpoint_every", "export_saved_model", "train_non_private_baseline",
                         "seed", "tuned_from"}
    for cls in config.TRAINING_SECTIONS:
        (check,) = [name for name in vars(cls) if name.startswith("validate_")]
        getattr(cls(), check)("training")  # AttributeError if it read another section's field
        assert issubclass(config.TrainingConfig, cls)
    # Positive control: a section whose check reads a field of another section fails alone.

    @dataclasses.dataclass
    class Leaky:
        workers: int = 1

        def validate_leaky(self, prefix):
            return self.batch_size % self.workers

    with pytest.raises(AttributeError, match="batch_size"):
        Leaky().validate_leaky("training")


def test_a_section_error_names_the_flat_training_field():
    with pytest.raises(ConfigError, match=r"training\.adam_bc_gamma"):
        load_config(overrides=["training.adam_bc_gamma=0"])
    with pytest.raises(ConfigError, match=r"training\.stats_every"):
        load_config(overrides=["training.stats_every=0"])
