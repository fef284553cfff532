"""`dpbert privatize`: the subcommand's parser and command (dpbert_cli/privatize.py), and through `dpbert`."""
import argparse
import math

import pytest

from dpbert_cli.privatize import add_privatize_parser, cmd_privatize

TEXT = "Patient was given aspirin 10 mg daily for fever.\nHeart rate high, blood pressure low.\n"


def _parser():
    parser = argparse.ArgumentParser(prog="dpbert")
    add_privatize_parser(parser.add_subparsers(dest="command"))
    return parser


@pytest.fixture
def files(tmp_path, toy_embeddings):
    from dpbert.local_privacy.embeddings import write_hf_checkpoint

    model = write_hf_checkpoint(toy_embeddings, tmp_path / "model")
    source = tmp_path / "notes.txt"
    source.write_text(TEXT, encoding="utf-8")
    return tmp_path, model, source


def test_round_trip_at_large_eta(files, toy_embeddings, capsys):
    tmp_path, model, source = files
    tokenizer = toy_embeddings.tokenizer
    for eta in ("inf", "1e9"):
        out = tmp_path / f"out-{eta}.txt"
        args = _parser().parse_args(["privatize", "--eta", eta, "--input", str(source), "--output", str(out),
                                     "--model", str(model), "--seed", "1"])
        assert args.func(args) == 0
        expected = [tokenizer.decode(tokenizer.encode(line, add_special_tokens=False).ids)
                    for line in TEXT.splitlines()]
        assert out.read_text(encoding="utf-8").splitlines() == expected
        assert "0.0% changed" in capsys.readouterr().out


def test_small_eta_and_json(files, capsys):
    import json

    tmp_path, model, source = files
    args = _parser().parse_args(["privatize", "--eta", "0.5", "--input", str(source), "--output",
                                 str(tmp_path / "o.txt"), "--model", str(model), "--json"])
    assert cmd_privatize(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lines"] == 2 and summary["fraction_changed"] > 0.5 and not summary["seeded"]


@pytest.mark.parametrize("eta", ["0", "-1", "nan", "abc"])
def test_bad_eta_is_a_usage_error(eta, files):
    tmp_path, model, source = files
    with pytest.raises(SystemExit) as err:
        _parser().parse_args(["privatize", "--eta", eta, "--input", str(source), "--output", "x"])
    assert err.value.code == 2


def test_missing_files_exit_2(files, capsys):
    tmp_path, model, source = files
    for argv in (["--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o.txt"), "--model", str(model)],
                 ["--input", str(source), "--output", str(tmp_path / "o.txt"), "--model", str(tmp_path / "nope")]):
        args = _parser().parse_args(["privatize", "--eta", "10", *argv])
        assert cmd_privatize(args) == 2
        assert "dpbert privatize: error" in capsys.readouterr().err


def test_through_dpbert_cli(files):
    from dpbert_cli.main import main

    tmp_path, model, source = files
    out = tmp_path / "cli.txt"
    assert main(["privatize", "--eta", "inf", "--input", str(source), "--output", str(out),
                 "--model", str(model)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2


def test_public_checkpoint():
    """The default table: the public checkpoint, installed from requirements/nodeps.txt (a missing
    one is a broken install: it fails here)."""
    from dpbert.local_privacy.embeddings import load_embeddings
    from dpbert.local_privacy.text import privatize_text

    embeddings = load_embeddings()
    assert embeddings.public and embeddings.dim == 384 and len(embeddings.tokens) == 30522
    text = "The patient was started on metoprolol for atrial fibrillation."
    assert privatize_text(text, embeddings.tokenizer, embeddings, math.inf) == text.lower()
    noisy = privatize_text(text, embeddings.tokenizer, embeddings, 10.0, rng=0)
    assert noisy != text.lower() and "[" not in noisy
