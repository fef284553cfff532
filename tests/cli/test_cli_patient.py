"""`dpbert privacy dpsgd --unit patient` and `dpbert run` refusing a corpus without patient ids (exit 2)."""
import json

import dp_accounting
import pytest

from dpbert.accounting import accountant
from dpbert_cli.main import main


def test_privacy_dpsgd_per_patient(capsys):
    argv = ["privacy", "dpsgd", "--noise-multiplier", "1.1", "--delta", "1e-6", "--steps", "400"]
    assert main(argv + ["--examples", "50000", "--batch-size", "250", "--json"]) == 0
    per_tuple = json.loads(capsys.readouterr().out)
    code = main(argv + ["--unit", "patient", "--patients", "50000", "--patients-per-step", "250",
                        "--max-tuples-per-patient", "8", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(per_tuple) | {"unit"} <= set(data) and data["unit"] == "patient"
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(250 / 50000, dp_accounting.GaussianDpEvent(1.1)), 400)
    want = dp_accounting.pld.PLDAccountant(
        value_discretization_interval=accountant.PLD_DISCRETIZATION).compose(event).get_epsilon(1e-6)
    assert data["epsilon_pld"] == pytest.approx(want, rel=1e-12)
    assert data["event"]["sampling_unit"] == "patient" and data["max_contributions"] == 8
    assert main(argv + ["--unit", "patient", "--patients", "50000", "--patients-per-step", "250"]) == 0
    assert "per patient" in capsys.readouterr().out


@pytest.mark.parametrize("extra", [["--unit", "patient", "--patients", "100"],
                                   ["--unit", "patient", "--patients", "100", "--patients-per-step", "10",
                                    "--examples", "5"],
                                   ["--patients", "100", "--patients-per-step", "10"],
                                   ["--unit", "patient", "--patients", "100", "--patients-per-step", "10",
                                    "--sampling", "shuffle"]])
def test_privacy_dpsgd_patient_argument_errors_exit_2(capsys, extra):
    code = main(["privacy", "dpsgd", "--noise-multiplier", "1", "--delta", "1e-6", "--steps", "10"] + extra)
    assert code == 2 and "Traceback" not in capsys.readouterr().err


def test_run_with_patient_unit_on_a_corpus_without_patient_ids_exits_2(tmp_path, capsys):
    corpus = tmp_path / "notes"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the patient was admitted with chest pain and discharged home " * 30)
    code = main(["run", "--output", str(tmp_path / "out"), "--set", f"corpus.path={corpus}",
                 "--set", "corpus.dataset_id=notes", "--set", "privacy.unit=patient", "--set", "training.dataset_patients=100000",
                 "--set", "training.dataset_size=1000"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "privacy.unit = patient needs a patient id" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
