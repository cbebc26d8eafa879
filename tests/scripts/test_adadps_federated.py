"""The federated AdaDPS script's pieces: its side-information file fits `linear` on Fashion-MNIST's shape
(rare pixels small, the largest 1), and every method's command line resolves to a configuration."""

from pathlib import Path

import jax
import numpy as np
from reference import imported_script

from jaxfl.algorithms.adadps import load_side_information, side_information_tree
from jaxfl.cli import build_parser, resolve_config
from jaxfl.models import make_model

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "adadps_federated.py"


def test_the_pixel_side_information_fits_the_linear_model(tmp_path):
    with imported_script(SCRIPT) as script:
        images = np.zeros((50, 28, 28, 1), np.float32)
        images[:, 10:18, 10:18] = 1.0  # Central pixels always on, the rest never.
        path = script.pixel_side_information(images, tmp_path / "a.npz")
    params = jax.eval_shape(make_model("linear", (28, 28, 1), 10).init, jax.random.key(0))
    divisor = side_information_tree(params, load_side_information(str(path)))
    kernel = np.asarray(divisor["dense"]["kernel"])
    assert kernel.shape == (784, 10) and kernel.max() == 1.0
    np.testing.assert_allclose(kernel.min(), 0.01 / 1.01, rtol=1e-6)
    np.testing.assert_array_equal(divisor["dense"]["bias"], np.ones(10))


def test_every_method_resolves_to_a_configuration(tmp_path):
    with imported_script(SCRIPT) as script:
        for method, (flags, tuned, grid) in script.METHODS.items():
            argv = ["run", *script.COMMON, *flags, tuned, str(grid[0]), "--side-information", "a.npz"]
            config = resolve_config(build_parser().parse_args(argv))
            assert config.algorithms == [method] and config.privacy.epsilon == script.EPSILON
