"""Nothing lost to a typo: config errors name the file, the key and what was expected, and every
output folder is checked before the first round (issue 36, items 3 and 8)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from coordinator.runtime.coordinator_command import coordinator_config_from_toml
from edge_sdk.device_config import client_from_toml
from edge_sdk.paths import writable_dir, writable_file


def _edgefl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_sdk.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("toml, words", [
    ('device_id = "d"\nheartbeat_s = "often"\n', "heartbeat_s must be a number, got 'often'"),
    ('device_id = 7\n', "device_id must be a string, got '7'"),
    ('device_id = "d"\n[broker]\npassword_file = "/nonexistent/pw"\n',
     "[broker] password_file /nonexistent/pw cannot be read: No such file or directory"),
    ('device_id = "d"\n[broker]\nkeepalive = "30s"\n', "[broker] keepalive must be an integer, got '30s'"),
    ('device_id = "d"\n[broker]\nca_file = "/nonexistent/ca.crt"\n', "[broker] ca_file /nonexistent/ca.crt does not exist"),
    ('device_id = "d"\n[link]\nchunk_size = 1.5\n', "[link] chunk_size must be an integer, got '1.5'"),
    ('device_id = "d"\n[data]\nshard = "two"\n', "[data] shard must be an integer, got 'two'"),
    ('device_id = "d"\n[data]\nreread_s = "often"\n', "[data] reread_s must be a number, got 'often'"),
    ('device_id = "d"\n[data]\nroot = "/nonexistent/data"\n', "[data] root /nonexistent/data is not a folder"),
])
def test_a_client_config_error_names_the_file_and_the_key(tmp_path, toml, words):
    path = tmp_path / "client.toml"
    path.write_text(toml)
    with pytest.raises(ValueError) as info:
        client_from_toml(path)
    assert str(info.value) == f"{path}: {words}" or str(info.value).startswith(f"{path}: {words}")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("toml, words", [
    ('[federation]\nrounds = "ten"\n', "[federation] rounds must be an integer >= 1, got 'ten'"),
    ('method = "fedavgg"\n', "method = 'fedavgg' is not a method; choose from fdnnc, fedavg"),
    ('[federation]\nmin_new_samples = -5\n', "[federation] min_new_samples must be an integer >= 0, got -5"),
    ('[federation]\nwindows = "22:00-06:00"\n', "[federation] windows must be a list such as"),
    ('[federation]\nwindows = ["22-06"]\n', "[federation] windows: training window must look like 'HH:MM-HH:MM'"),
    ('[federation]\nnew_samples_share = 2\n', "[federation] new_samples_share must be a number in (0, 1]"),
    ('[federation]\nmin_eval_samples = 0\n', "[federation] min_eval_samples must be an integer >= 1"),
    ('[options]\nclp = "3x"\n', "[options] fedavg: unknown option(s) ['clp']"),
    ('method = "flanc"\n[options]\nclip = "banana"\n', "[options] flanc: option clip: expected none"),
    ('[train]\nlr = "fast"\n', "[train] lr must be a finite number"),
    ('out = 3\n', "out must be a string, got '3'"),
    ('[limits]\nmessages_per_s = -1\n', "[limits] "),
    ('[broker]\npassword_file = "/nonexistent/coordinator.password"\n',
     "[broker] password_file /nonexistent/coordinator.password cannot be read: No such file or directory"),
    # no held-out data and no whole [task]: the job's task is unknown (no silent MNIST any more)
    ('', 'without dataset = "..." (held-out data) the task comes from [task] alone: it needs input_shape, '
         'num_classes (or classes), mean, std'),
    ('[task]\ninput_shape = [1, 28, 28]\nclasses = ["a", "b"]\n', "[task] preprocessing needs 'mean'"),
    ('[task]\ninput_shape = [1, 28, 28]\nnum_classes = 10\nmean = [0.5]\n', "[task] preprocessing needs 'std'"),
    ('dataset = "digits"\n[task]\ninput_shape = [1, 0]\nnum_classes = 10\n',
     "[task] input_shape must be 1 to 8 positive integers"),
    ('dataset = "digits"\n[task]\nnum_classes = 10\n',
     "[task] needs both input_shape and num_classes (or classes), got only num_classes"),
    ('dataset = "digits"\n[task]\ninput_shape = [1, 8, 8]\nnum_classes = 3\nmean = [1]\nstd = [1]\n'
     'classes = ["a", "b"]\n', "[task] num_classes = 3 but classes names 2"),
    ('dataset = "digits"\n[task]\ninput_shape = "1x8x8"\nnum_classes = 10\n',
     "[task] input_shape must be a list"),
    ('dataset = "digits"\n[task]\ninput_shap = [1, 8, 8]\n',
     "[task]: unknown keys ['input_shap']; allowed: ['classes', 'input_shape', 'mean', 'num_classes', 'repeat', "
     "'resample', 'std']"),
    ('dataset = "digits"\n[train]\nlr = 2.0\n[federation]\nlr_decay = "5:10"\n',
     "[federation] lr_decay: from round 6 the lr would be 20 (lr 2 times 10); a device takes at most 10"),
    ('[task]\ninput_shape = [1, 28, 28]\nnum_classes = 10\nmean = [0.5]\nstd = [1]\nresample = true\n',
     "[task] preprocessing resample needs a series input_shape (channels, length), got (1, 28, 28)"),
    ('[task]\ninput_shape = [1, 300]\nnum_classes = 10\nmean = [0.5]\nstd = [1]\nresample = "yes"\n',
     "[task] preprocessing resample must be true or false"),
    ('dataset = "digits"\n[homeassistant]\nenabled = true\nprefix = "homeassistant/#"\n',
     "[homeassistant] prefix 'homeassistant/#' is not a topic of [A-Za-z0-9_-] levels"),
    ('dataset = "digits"\n[homeassistant]\nbirth_topic = "/status"\n',
     "[homeassistant] birth_topic '/status' is not a topic of [A-Za-z0-9_-] levels"),
    ('dataset = "digits"\n[homeassistant]\nenabled = "yes"\n', "[homeassistant] enabled must be"),
    ('dataset = "digits"\n[homeassistant]\nprefx = "ha"\n', "[homeassistant]: unknown keys ['prefx']"),
    ('dataset = "digits"\nmethod = "reft"\n[federation]\nasynchronous = true\n',
     "asynchronous aggregation is for"),
    ('dataset = "digits"\n[federation]\nstaleness = "square"\n', "[federation] staleness must be one of"),
    ('dataset = "digits"\n[federation]\nbuffer_size = 0\n', "[federation] buffer_size must be an integer >= 1"),
])
def test_a_coordinator_config_error_names_the_file_and_the_key(tmp_path, toml, words):
    path = tmp_path / "coordinator.toml"
    path.write_text(toml)
    with pytest.raises(ValueError) as info:
        coordinator_config_from_toml(path)
    assert str(info.value).startswith(f"{path}: {words}"), str(info.value)


def test_the_task_of_the_toml_and_of_the_held_out_data_must_agree(tmp_path):
    from coordinator.runtime.coordinator_command import job_task
    from coordinator.runtime.task import Task

    path = tmp_path / "coordinator.toml"
    path.write_text('dataset = "digits"\n[task]\ninput_shape = [1, 28, 28]\nnum_classes = 10\n')
    with pytest.raises(ValueError, match=r"\[task\] says inputs of shape \(1, 28, 28\) in 10 classes; dataset "
                                         r"'digits' has \(1, 8, 8\) in 10"):
        job_task(coordinator_config_from_toml(path))
    path.write_text('[task]\ninput_shape = [1, 8, 8]\nnum_classes = 10\nmean = [4.9]\nstd = [6.0]\n')
    task, preprocessing, held_out = job_task(coordinator_config_from_toml(path))
    assert (task, held_out) == (Task((1, 8, 8), 10), None)
    assert (preprocessing.mean, preprocessing.std, preprocessing.input_shape) == ((4.9,), (6.0,), (1, 8, 8))


def test_unwritable_folders_are_one_line_errors(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"--out .*a-file/report is not writable: Not a directory"):
        writable_dir(blocker / "report", "--out")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        writable_dir(blocker, "state_dir")
    with pytest.raises(ValueError, match="is a folder, not a file"):
        writable_file(tmp_path, "--save")
    made = writable_dir(tmp_path / "new" / "deeper", "--out")
    assert made.is_dir() and list(made.iterdir()) == []  # the probe file is gone


@pytest.mark.slow
def test_a_simulation_with_an_unwritable_out_fails_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    started = time.monotonic()
    proc = _edgefl("simulate", "--clients", "2", "--rounds", "3", "--out", str(blocker / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(f"--out {blocker}/run is not writable: Not a directory")
    assert "round 1" not in proc.stdout and time.monotonic() - started < 60  # no broker, no round


@pytest.mark.slow
def test_a_profile_with_an_unwritable_save_fails_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = _edgefl("profile", "--save", str(blocker / "p.toml"), "--seconds", "5")
    assert proc.returncode == 2 and "--save" in proc.stderr and "gflops" not in proc.stdout


@pytest.mark.slow
def test_the_shipped_example_configs_fail_on_this_machine_with_the_missing_file_named():
    for command, config, key in (("coordinator", "deploy/coordinator.toml", "[broker] password_file"),
                                 ("client", "deploy/raspberrypi/client.toml", "[broker] password_file")):
        proc = _edgefl(command, "--config", config)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith(f"edgefl {command}: error: {config}: {key}") and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_an_lr_a_method_does_not_use_is_said(tmp_path):
    """`--lr` with a method that trains with its own learning rate is not silently ignored."""
    from coordinator.strategies import strategy_class

    assert strategy_class("fedavg").own_lr({}) is None and strategy_class("flanc").own_lr({}) is None
    assert "local_lr=0.01" in strategy_class("reft").own_lr({"local_lr": "0.01"})
    assert strategy_class("fedpara").own_lr({"optimizer": "sgd"}) is None  # SGD trains with the run's --lr
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the job stops right after the warning, before any work
    for method, said in (("reft", True), ("fedavg", False)):
        proc = _edgefl("simulate", "--method", method, "--lr", "0.2", "--out", str(blocker / "x"))
        assert ("--lr 0.2 is not used: reft trains with its own local_lr=0.003" in proc.stdout) == said, proc.stdout
