import json

from fpa.cli import main
from fpa.train.metrics import read_metrics


def test_prepare_data_and_train_commands(tmp_path, capsys):
    data = tmp_path / "data"
    assert main(["prepare-data", "stdlib", "--out-dir", str(data), "--max-bytes", "200000"]) == 0
    assert json.loads(capsys.readouterr().out)["vocab_size"] == 257
    (tmp_path / "c.json").write_text(
        json.dumps(
            {
                "out_dir": str(tmp_path / "run"),
                "data_dir": str(data),
                "steps": 3,
                "seq_len": 32,
                "batch_size": 2,
                "ckpt_every": 3,
                "eval_every": 3,
                "log_every": 1,
            }
        )
    )
    argv = [
        "train",
        "--config",
        str(tmp_path / "c.json"),
        "--attention",
        "softmax_rope",
        "--no-progress",
        "--model-overrides",
        '{"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}',
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out  # stdout is not a terminal: progress lines, then the summary
    assert out.startswith("[train ") and " step " in out.splitlines()[0]
    summary = json.loads(out[out.index("\n{") + 1 :])
    assert summary["steps"] == 3 and len(read_metrics(tmp_path / "run")) == 3
    assert json.loads((tmp_path / "run" / "model" / "config.json").read_text())["attention"] == "softmax_rope"


def test_cli_bad_input_is_a_clean_error(tmp_path, capsys):
    assert main(["train", "--out-dir", str(tmp_path), "--steps", "0"]) == 2
    assert "steps must be a positive int" in capsys.readouterr().err
    assert main(["prepare-data", str(tmp_path / "missing*.txt"), "--out-dir", str(tmp_path / "o")]) == 2


def test_documented_110m_recipe_is_a_valid_config(tmp_path):
    import re
    from pathlib import Path

    import yaml

    from fpa.train import TrainConfig

    doc = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    block = re.search(r"`110m-fpa.yaml`:\n\n```yaml\n(.*?)```", doc, re.S).group(1)
    cfg = TrainConfig.from_dict(yaml.safe_load(block))
    assert (cfg.preset, cfg.seq_len, cfg.batch_size, cfg.steps, cfg.grad_accum) == ("110m", 2048, 256, 20000, 8)
    assert cfg.batch_size * cfg.seq_len * cfg.steps == 10_485_760_000  # the 110m preset's tokens per run
    assert cfg.model_config(32000).hidden_size == 768
