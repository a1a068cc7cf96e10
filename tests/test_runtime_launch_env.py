"""The launcher's environment variables are checked, one line naming the variable, before torch.distributed reads them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import TrainConfigError
from pipeplan.runtime.transport.launch_env import LaunchEnv, check_launch_env, read_launch_env

GOOD = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_a_well_formed_environment_is_read() -> None:
    """torchrun's four variables (and LOCAL_RANK) give the rank, world size, address and port as numbers."""
    assert read_launch_env({**GOOD, "LOCAL_RANK": "1"}) == LaunchEnv(1, 2, "127.0.0.1", 29500, 1)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"RANK": "5"}, "RANK='5' is not below WORLD_SIZE='2': the ranks of 2 processes are 0..1"),
        ({"RANK": "2"}, "RANK='2' is not below WORLD_SIZE='2'"),
        ({"RANK": "-1"}, "RANK='-1' must be an integer >= 0"),
        ({"RANK": "abc"}, "RANK='abc' must be an integer >= 0"),
        ({"RANK": ""}, "RANK='' must be an integer >= 0"),
        ({"RANK": "1.0"}, "RANK='1.0' must be an integer >= 0"),
        ({"RANK": " 1"}, "RANK=' 1' must be an integer >= 0"),
        ({"RANK": "9" * 5000}, "RANK='9999"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0' must be >= 1"),
        ({"WORLD_SIZE": "x"}, "WORLD_SIZE='x' must be an integer >= 0"),
        ({"WORLD_SIZE": "200000"}, "WORLD_SIZE too large: 200,000 devices, the limit is 131,072"),
        ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK='3' is not below LOCAL_WORLD_SIZE='2'"),
        ({"LOCAL_RANK": "-2"}, "LOCAL_RANK='-2' must be an integer >= 0"),
        ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0' must be >= 1"),
        ({"GROUP_RANK": "node0"}, "GROUP_RANK='node0' must be an integer >= 0"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT='0' must be a port in 1..65535"),
        ({"MASTER_PORT": "65536"}, "MASTER_PORT='65536' must be a port in 1..65535"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' must be a port in 1..65535"),
        ({"MASTER_ADDR": ""}, "MASTER_ADDR='' must be a host name or address"),
        ({"MASTER_ADDR": "127.0.0.1 x"}, "MASTER_ADDR='127.0.0.1 x' must be a host name or address"),
    ],
)
def test_a_malformed_or_out_of_range_variable_is_named_with_its_value(changes: dict[str, str], named: str) -> None:
    """Each bad value is refused by both checks with the variable, its value and the way out."""
    for check in (check_launch_env, read_launch_env):
        with pytest.raises(TrainConfigError, match="environment variable ") as caught:
            check({**GOOD, **changes})
        assert named in str(caught.value)
        assert str(caught.value).endswith("start the job with torchrun or with --local N, which set it")


def test_a_missing_variable_is_read_launch_envs_to_name_not_check_launch_envs() -> None:
    """Without torchrun's variables, check_launch_env passes and read_launch_env names every missing one."""
    check_launch_env({})
    check_launch_env({"RANK": "3"})  # nothing to compare it with
    with pytest.raises(TrainConfigError, match=r"must run under torchrun or with --local N \(missing WORLD_SIZE, MASTER_PORT\)"):
        read_launch_env({"RANK": "0", "MASTER_ADDR": "127.0.0.1"})


@given(rank=st.integers(0, 200), world=st.integers(1, 200))
def test_a_rank_is_accepted_exactly_when_it_is_below_the_world_size(rank: int, world: int) -> None:
    """RANK r of WORLD_SIZE w passes if and only if 0 <= r < w."""
    env = {**GOOD, "RANK": str(rank), "WORLD_SIZE": str(world)}
    if rank < world:
        assert read_launch_env(env).rank == rank
    else:
        with pytest.raises(TrainConfigError, match=f"RANK='{rank}' is not below WORLD_SIZE='{world}'"):
            read_launch_env(env)


@given(text=st.text(max_size=8).filter(lambda t: not (t.isascii() and t.isdigit())))
def test_any_rank_that_is_not_plain_digits_is_refused(text: str) -> None:
    """A sign, a fraction, a space or a letter in RANK is refused; int() would take some of these (' 1', '+1', '١')."""
    with pytest.raises(TrainConfigError, match=r"RANK=.* must be an integer >= 0"):
        read_launch_env({**GOOD, "RANK": text})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK='5' is not below WORLD_SIZE='2'"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' must be an integer >= 0"),
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' must be an integer >= 0"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be >= 1"),
    ],
)
def test_train_and_probe_refuse_a_bad_launcher_variable_with_one_line_before_any_work(
    tmp_path: Path, variables: dict[str, str], named: str
) -> None:
    """`pipeplan train` and `probe` under a bad RANK/WORLD_SIZE print one line naming it, exit 2, and write nothing."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", **variables}
    for args in (["train", "--schedule", "1f1b", "--steps", "1", "--checkpoint-dir", "ck", "--checkpoint-every", "1"],
                 ["probe", "--out", "c.json", "--steps", "1"]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "pipeplan", *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"error: TrainConfigError: environment variable {named}")
        assert list(os.listdir(tmp_path)) == []
