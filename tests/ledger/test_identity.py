"""dpbert.ledger.identity: one normalised id per dataset, and the synthetic corpus never near a
real dataset's ledger (its id is its generator's, its ledger a local folder of its own)."""
import dataclasses

import pytest

from dpbert import storage
from dpbert.config import ConfigError, load_config
from dpbert.ledger import identity
from tests.no_cloud_storage import NoCloudStorage

REAL = ["corpus.dataset_id=Ward7", "privacy.ledger=gs://hospital/ledgers", "privacy.epsilon_budget=8"]


def ledger_names(ids, normalise=None):
    """The ledger object names ``ids`` map to (``normalise``: a replacement normaliser)."""
    if normalise is None:
        return {identity.ledger_uri("/l", i) for i in ids}
    return {"/l/" + normalise(i) + ".json" for i in ids}


def test_case_and_surrounding_spaces_name_one_dataset_a_suffix_another(monkeypatch):
    assert ledger_names(["Ward7", " ward7 ", "ward7", "WARD7\t"]) == {"/l/ward7.json"}
    assert ledger_names(["ward7", "ward7-v2"]) == {"/l/ward7.json", "/l/ward7-v2.json"}
    assert identity.safe_name(" Ward7 ") == "ward7"
    # positive control: without the normalisation the same dataset gets two ledgers (two budgets)
    assert len(ledger_names(["Ward7", "ward7"], normalise=str)) == 2


def test_the_configuration_accepts_and_normalises_the_dataset_id():
    for given in ("Ward7", " ward7 ", "ward7"):
        config = load_config(None, ["corpus.path=/x/notes.jsonl", f"corpus.dataset_id={given}"], preset="demo")
        assert config.corpus.dataset_id == "ward7" and identity.dataset_id_for(config.corpus) == "ward7"
    with pytest.raises(ConfigError, match="corpus.dataset_id"):
        load_config(None, ["corpus.dataset_id=-ward7"], preset="demo")
    user = load_config(None, ["corpus.path=/x/notes.jsonl", "corpus.dataset_id=x1"], preset="demo").corpus
    assert identity.dataset_id_for(dataclasses.replace(user, dataset_id=" Ward7")) == "ward7"


def test_a_user_corpus_cannot_take_the_synthetic_prefix():
    config = load_config(None, ["corpus.path=/x/notes.jsonl", "corpus.dataset_id=Synthetic-abc"], preset="demo")
    with pytest.raises(ConfigError, match="reserved"):
        identity.dataset_id_for(config.corpus)


def test_the_synthetic_corpus_ignores_a_configured_dataset_id_and_ledger(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DPBERT_SYNTHETIC_LEDGER", raising=False)  # the conftest sets one per test
    monkeypatch.setattr(identity, "_SAID", set())
    monkeypatch.setenv(identity.LEDGER_ENV, str(tmp_path / "ledgers"))
    config = load_config(None, REAL, preset="demo")
    assert config.corpus.path is None
    sid = identity.dataset_id_for(config.corpus)
    assert sid == identity.synthetic_dataset_id(config.corpus) and identity.is_synthetic_id(sid)
    location = identity.location_for(config)
    assert location == str(tmp_path / "ledgers") + "-synthetic"
    # whatever location a compiled target carries, the synthetic id's ledger is the local one
    assert identity.ledger_uri("gs://hospital/ledgers", sid) == storage.join(location, sid + ".json")
    identity.dataset_id_for(config.corpus)  # said once per process
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if "corpus.dataset_id ward7 is ignored" in line]) == 1
    assert len([line for line in err if "privacy.ledger gs://hospital/ledgers is ignored" in line]) == 1
    assert identity.remote_ledger_problem(config) is None  # no gs:// ledger needed for public data


def test_the_synthetic_ledger_folder_is_local_and_apart(tmp_path, monkeypatch):
    monkeypatch.delenv("DPBERT_SYNTHETIC_LEDGER", raising=False)  # the conftest sets one per test
    monkeypatch.setenv(identity.LEDGER_ENV, "gs://hospital/ledgers")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert identity.synthetic_location() == str(tmp_path / "xdg" / "dpbert" / "ledgers-synthetic")
    monkeypatch.setenv(identity.SYNTHETIC_LEDGER_ENV, "gs://hospital/synthetic")
    with pytest.raises(ConfigError, match="off Cloud Storage"):
        identity.synthetic_location()
    monkeypatch.setenv(identity.LEDGER_ENV, str(tmp_path / "l"))
    monkeypatch.setenv(identity.SYNTHETIC_LEDGER_ENV, str(tmp_path / "l"))
    with pytest.raises(ConfigError, match="must not share"):
        identity.synthetic_location()
    monkeypatch.setenv(identity.SYNTHETIC_LEDGER_ENV, str(tmp_path / "s"))
    same = load_config(None, [f"privacy.ledger={tmp_path / 's'}"], preset="demo")
    with pytest.raises(ConfigError, match="keep the real"):
        identity.location_for(same)


def test_a_real_dataset_keeps_its_configured_ledger(tmp_path):
    config = load_config(None, ["corpus.path=/x/notes.jsonl", *REAL], preset="demo")
    assert identity.dataset_id_for(config.corpus) == "ward7"
    assert identity.location_for(config) == "gs://hospital/ledgers"
    assert identity.ledger_uri(identity.location_for(config), "Ward7") == "gs://hospital/ledgers/ward7.json"
    assert identity.remote_ledger_problem(dataclasses.replace(
        config, privacy=dataclasses.replace(config.privacy, ledger=str(tmp_path)))) is not None


@pytest.fixture
def no_cloud(monkeypatch):
    from dpbert.storage import api

    spy = NoCloudStorage()
    monkeypatch.setitem(api._SINGLETONS, "gs", spy)  # pylint: disable=protected-access
    return spy


def test_budget_and_guard_never_read_a_real_ledger_for_the_synthetic_corpus(no_cloud, tmp_path, monkeypatch):
    from pipeline import guard

    monkeypatch.setenv(identity.SYNTHETIC_LEDGER_ENV, str(tmp_path / "synthetic"))
    config = load_config(None, [*REAL, f"pipeline.output_dir={tmp_path / 'out'}"], preset="demo")
    guard.remaining_budget(config)  # a fresh local synthetic ledger: read, nothing spent
    guard.check_budget(config)
    assert no_cloud.touched == []
    # positive control: the same calls on a real dataset do reach its gs:// ledger
    real = load_config(None, ["corpus.path=/x/notes.jsonl", *REAL], preset="demo")
    with pytest.raises(Exception):
        guard.remaining_budget(real)
    assert "gs://hospital/ledgers/ward7.json" in no_cloud.touched
