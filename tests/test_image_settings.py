"""data.image_size and data.normalize: recorded with the model, applied again by predict (issue 25 item 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedxrisk.data.decode import load_image
from fedxrisk.data.preprocessing import NORMALIZE_PRESETS, normalization
from fedxrisk.experiment import ConfigError, RunConfig, build, run_experiment
from fedxrisk.inference import load_trained
from fedxrisk.models import build_model
from fedxrisk.prediction import predict
from helpers import image_folder_config


def _cfg(image_folder, **kw) -> RunConfig:
    return image_folder_config(image_folder, **{**dict(model="cnn", rounds=2, stream=False), **kw})


@pytest.mark.parametrize("stream", [False, True])
def test_image_size_and_normalization_are_stored_and_reused_by_predict(image_folder, tmp_path, stream):
    norm = {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}
    run_experiment(_cfg(image_folder, image_size=12, normalize=norm, stream=stream), tmp_path / "run")
    blob = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert list(blob["input_shape"]) == [3, 12, 12]
    assert blob["preprocessing"]["image_size"] == 12 and blob["preprocessing"]["normalize"] == norm
    files = sorted((image_folder / "b").glob("*.png"))[:3]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for f in files:
        (inputs / f.name).write_bytes(f.read_bytes())
    scores = predict(tmp_path / "run", inputs, workers=0).logits[:, 0]
    # by hand: decode at 12×12, scale to [0, 1], normalize per channel, the same weights without the hook
    x = torch.from_numpy(np.stack([load_image(f, 12) for f in files]).astype(np.float32) / 255.0)
    x = (x - torch.tensor(norm["mean"]).view(1, 3, 1, 1)) / torch.tensor(norm["std"]).view(1, 3, 1, 1)
    trained = load_trained(tmp_path / "run")
    plain = build_model("cnn", (3, 12, 12)).eval()
    plain.load_state_dict({**trained.params, **trained.buffers}, strict=False)
    with torch.no_grad():
        expected = plain(x).reshape(-1).numpy()
    assert np.allclose(scores, expected, atol=1e-5)


def test_normalization_changes_the_inputs_the_model_sees(image_folder):
    plain = build(_cfg(image_folder)).problem
    normed = build(_cfg(image_folder, normalize="imagenet")).problem
    x = torch.rand(2, 3, 32, 32)
    params, buffers = plain.init_model()  # same seed: the same weights
    a = normed.logits(params, buffers, x, train=False)[0]
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in NORMALIZE_PRESETS["imagenet"])
    b = plain.logits(params, buffers, (x - mean) / std, train=False)[0]
    assert torch.allclose(a, b, atol=1e-5)
    assert build(_cfg(image_folder, image_size=16)).data.data.input_shape == (3, 16, 16)


def test_augment_choice_sets_the_training_augmenter(image_folder):
    from fedxrisk.data.augment import RandomCropFlip

    assert build(_cfg(image_folder)).data.augment is None  # off by default
    crop = build(_cfg(image_folder, augment="crop_flip", image_size=16)).data.augment
    flip = build(_cfg(image_folder, augment="flip")).data.augment
    assert isinstance(crop, RandomCropFlip) and crop.padding == 2 and flip.padding == 0
    with pytest.raises(ConfigError, match="unknown data.augment 'rotate'; choose one of"):
        build(_cfg(image_folder, augment="rotate"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"image_size": 0}, "data.image_size must lie in [1, 4096], got 0"),
        ({"normalize": "imagenett"}, "data.normalize must be \"none\", ['imagenet'] or"),
        ({"normalize": {"mean": [0.5], "std": [0.0]}}, "data.normalize std must be > 0"),
        (
            {"dataset": "digits", "data_dir": None, "image_size": 32},
            "data.image_size, data.normalize and data.augment apply",
        ),
    ],
)
def test_bad_image_settings_are_refused_in_one_line(image_folder, settings, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build(_cfg(image_folder, **settings))
    assert normalization("none") is None
