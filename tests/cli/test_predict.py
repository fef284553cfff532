"""`dpbert predict` (in-process): fill-mask on a text from a trainer's artifact folder and from its
Hugging Face export gives the same tokens and probabilities, which are the softmax of an independent
numpy BertForMaskedLM over the exported files; more [MASK]s than the model's prediction slots are
all filled; no [MASK], a text longer than the model's positions, an unknown MODEL: exit 2, one line."""
import json

import numpy as np
import pytest
from scipy.special import softmax

from dpbert import exit_codes
from dpbert_cli.main import main
from tests.cli.test_export import VOCAB, _write_artifact
from tests.model.test_hf_export import hf_mlm_logits, read_hf

#: --dist loadgroup: the models built once per process (test_export.py's cache) are built on one worker.
pytestmark = pytest.mark.xdist_group("export_models")


TEXT = "the [MASK] rate of the [MASK] , fever [MASK] heart [MASK]"  # 4 masks, the model has 3 slots


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(artifact folder, its Hugging Face export folder)."""
    base = tmp_path_factory.mktemp("predict")
    _write_artifact(base / "artifact")
    assert main(["export", str(base / "artifact"), "--to", str(base / "hf")]) == exit_codes.OK
    return base / "artifact", base / "hf"


def _predict(capsys, *args):
    code = main(["predict", *map(str, args), "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == exit_codes.OK else out.err)


def _reference(hf_folder, text, k):
    """Top-k (token, probability) at each [MASK] from the numpy BertForMaskedLM on the exported files."""
    from dpbert.vocab.wordpiece import load_tokenizer

    config, t = read_hf(hf_folder)
    ids = np.asarray([load_tokenizer(hf_folder).encode(text).ids])
    probabilities = softmax(hf_mlm_logits(config, t, ids, np.ones_like(ids, np.float64))[0], axis=-1)
    out = []
    for position in np.flatnonzero(ids[0] == VOCAB.index("[MASK]")):
        best = np.argsort(-probabilities[position], kind="stable")[:k]
        out.append([(VOCAB[i], probabilities[position, i]) for i in best])
    return out


def test_predict_from_the_artifact_and_from_its_export_agree_with_the_numpy_reference(folders, capsys):
    artifact, hf = folders
    reference = _reference(hf, TEXT, 3)
    for model in (artifact, hf):
        code, result = _predict(capsys, model, "--text", TEXT, "--top-k", 3)
        assert code == exit_codes.OK and len(result["predictions"]) == 4
        for got, want in zip(result["predictions"], reference):
            assert [c["token"] for c in got["candidates"]] == [token for token, _ in want]
            np.testing.assert_allclose([c["probability"] for c in got["candidates"]], [p for _, p in want],
                                       atol=1e-5, rtol=0)
    assert result["positions"] == 16 and result["read_as"] == "Hugging Face export"


def test_the_text_output_names_each_mask_and_its_probabilities(folders, tmp_path, capsys):
    artifact, _ = folders
    note = tmp_path / "note.txt"
    note.write_text("the heart [MASK] .", encoding="utf-8")
    assert main(["predict", str(artifact), "--file", str(note), "--top-k", "2"]) == exit_codes.OK
    lines = capsys.readouterr().out.splitlines()
    assert "dpbert model" in lines[0] and "(16 positions)" in lines[0]
    assert lines[1].startswith("[MASK] 1 (token 3): ") and lines[1].count(", ") == 1 and len(lines) == 2


@pytest.mark.parametrize("args, message", [
    (["--text", "the heart rate"], "has no [MASK]"),
    (["--text", "the [mask] rate"], "has no [MASK]"),  # lower case is a word, not the mask token
    (["--text", "the [MASK] " + "heart rate " * 10], "is 24 tokens ([CLS] and [SEP] included) and the model reads 16"),
    (["--text", "the [MASK]", "--top-k", "0"], "--top-k must be >= 1"),
])
def test_bad_texts_are_exit_2_naming_why(folders, capsys, args, message):
    artifact, _ = folders
    code, err = _predict(capsys, artifact, *args)
    assert code == exit_codes.BAD_INPUT and message in err and len(err.strip().splitlines()) == 1


def test_an_unknown_model_or_file_is_exit_2(tmp_path, capsys):
    code, err = _predict(capsys, tmp_path / "nowhere", "--text", "the [MASK]")
    assert code == exit_codes.BAD_INPUT and "does not exist" in err
    code, err = _predict(capsys, tmp_path, "--text", "the [MASK]")
    assert code == exit_codes.BAD_INPUT and "no model_config.json" in err
    code, err = _predict(capsys, tmp_path, "--file", tmp_path / "none.txt")
    assert code == exit_codes.BAD_INPUT and "--file" in err and "does not exist" in err
