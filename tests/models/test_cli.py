from fpa.cli import main


def test_model_info(capsys):
    assert main(["model-info", "--preset", "110m", "--attention", "fpa"]) == 0
    out = capsys.readouterr().out
    assert "parameters=" in out and "layers=12" in out
    assert main(["model-info", "--attention", "bogus"]) == 2
