"""`python -m fedxrisk.flower new-app` as safe as the other writing commands (issue 34): it never
replaces a user's file without --overwrite nor writes through a link, and refuses settings the
server would refuse (a bool that is not one, SecAgg+ with a pooling algorithm, a NaN range)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

pytest.importorskip("flwr")

from fedxrisk.flower.__main__ import main  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402


def new_app(folder, *args: str):
    return CliRunner().invoke(main, ["new-app", str(folder), *args])


def one_line(result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("name", ["pyproject.toml", "fedxrisk_app.py"])
def test_new_app_never_replaces_a_users_file_without_overwrite(tmp_path, name):
    (tmp_path / name).write_text("# mine\n")
    assert "pass --overwrite" in one_line(new_app(tmp_path))
    assert (tmp_path / name).read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert new_app(tmp_path, "--overwrite").exit_code == 0
    assert "[tool.flwr.app.config]" in (tmp_path / "pyproject.toml").read_text()


def test_new_app_never_writes_through_a_link_even_with_overwrite(tmp_path):
    user = tmp_path / "user.toml"
    user.write_text("# mine\n")
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").symlink_to(user)
    assert "symbolic link" in one_line(new_app(app, "--overwrite"))
    assert user.read_text() == "# mine\n"


@pytest.mark.parametrize(
    "setting, message",
    [
        ("secure-aggregation=maybe", "'secure-aggregation': expected true/false, got 'maybe'"),
        ("secure-aggregation=1", "'secure-aggregation': expected true/false, got 1"),
        ("rounds=2.5", "'rounds': expected an integer, got 2.5"),
        ("lr=fast", "'lr': expected a number or \"none\", got 'fast'"),
    ],
)
def test_new_app_refuses_a_value_of_the_wrong_type(tmp_path, setting, message):
    assert message in one_line(new_app(tmp_path / "app", "--set", setting))
    assert not (tmp_path / "app").exists()


def test_a_string_false_is_false_not_on():
    cfg = FlowerConfig.from_run_config({"secure-aggregation": "false", "rounds": "3"})
    assert cfg.deploy.secure_aggregation is False and cfg.run.rounds == 3


def test_new_app_refuses_secagg_with_a_pooling_algorithm_and_a_nan_range(tmp_path):
    line = one_line(new_app(tmp_path / "a", "--set", "secure-aggregation=true", "--set", "algorithm=fedxl2"))
    assert "fedxl2 calls collective(s) ['pool']" in line
    line = one_line(
        new_app(tmp_path / "b", "--set", "secure-aggregation=true", "--set", "secure-aggregation-range=nan")
    )
    assert "secure-aggregation-range must be a finite number > 0, got nan" in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
