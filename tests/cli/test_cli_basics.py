import pytest

from dpbert_cli.main import main


def test_help_and_every_subcommand_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    commands = ["run", "synth", "privacy", "budget", "report", "release", "compile", "dashboard", "privatize"]
    out = capsys.readouterr().out
    assert all(c in out for c in commands)
    for command in commands:
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0


def test_bad_config_value_exits_2_naming_the_field(capsys):
    assert main(["run", "--set", "vocab.sigma=-1"]) == 2
    assert "vocab.sigma" in capsys.readouterr().err


def test_missing_corpus_exits_2_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main(["run", "--corpus", str(missing), "--output", str(tmp_path / "o"),
                 "--set", "corpus.dataset_id=notes"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_synth_writes_jsonl(tmp_path):
    from dpbert.data.readers import read_jsonl

    out = tmp_path / "c.jsonl"
    assert main(["synth", "--output", str(out), "--patients", "2"]) == 0
    docs = list(read_jsonl(out))
    assert len(docs) == 8 and docs[0].patient_id == "P000000"
