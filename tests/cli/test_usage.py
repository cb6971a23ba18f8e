"""A wrong flag is one line naming the flag and the value, and exit 2 —
before anything is started or connected, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.running import CEILING_S, Done, hcs

NOWHERE = ["--nats-url", "nats://127.0.0.1:1"]  # usage is checked before any connection

BAD_FLAGS = [
    # (argv, the flag it names, the value it quotes)
    (["place", "--vram", "16"], "--vram", "'16'"),
    (["place", "--vram", "0"], "--vram", "'0'"),
    (["place", "--vram", "-1"], "--vram", "'-1'"),
    (["place", "--vram", "nan"], "--vram", "'nan'"),
    (["place", "--vram", "inf"], "--vram", "'inf'"),
    (["place", "--vram", "16GB"], "--vram", "'16GB'"),
    (["place", "--vram", "16m"], "--vram", "'16m'"),
    (["place", "--devices", "0"], "--devices", "'0'"),
    (["place", "--devices", "-2"], "--devices", "'-2'"),
    (["place", "--devices", "two"], "--devices", "'two'"),
    (["place", "--acu", "nan"], "--acu", "'nan'"),
    (["place", "--tflops-fp16", "inf"], "--tflops-fp16", "'inf'"),
    (["place", "--tflops-bf16", "-1"], "--tflops-bf16", "'-1'"),
    (["place", "--vram", "16Gi", "--timeout", "0"], "--timeout", "'0'"),
    (["place", "--vram", "16Gi", "--substitution", "maybe"], "--substitution", "'maybe'"),
    (["place", "--vram", "16Gi", "--vendors", "nvdia"], "--vendors", "'nvdia'"),
    (["place", "--vram", "16Gi", "--models", "nvidia/B9000"], "--models", "'nvidia/B9000'"),
    (["up", "--webhook", "localhost:x"], "--webhook", "'localhost:x'"),
    (["up", "--webhook", ":8443"], "--webhook", "':8443'"),
    (["up", "--extender", "127.0.0.1:70000"], "--extender", "'127.0.0.1:70000'"),
    (["up", "--extender", "no-such-host.invalid:8888"], "--extender", "'no-such-host.invalid'"),
    (["up", "--for", "0"], "--for", "'0'"),
    (["up", "--for", "nan"], "--for", "'nan'"),
    (["certs", "--out", "x", "--ip", "x"], "--ip", "'x'"),
    (["certs", "--out", "x", "--dns", "bad name"], "--dns", "'bad name'"),
    (["bus", "init", "--replicas", "0"], "--replicas", "'0'"),
    (["bus", "init", "--replicas", "-1"], "--replicas", "'-1'"),
    (["bus", "init", "--replicas", "6"], "--replicas", "'6'"),
    (["watch", "hcs..health"], "subject", "'hcs..health'"),
    (["watch", "--count", "0"], "--count", "'0'"),
    (["top", "--once", "--connect-timeout", "0"], "--connect-timeout", "'0'"),
    (["convert", "16", "vram", "--to", "huawei/Ascend910B2"], "AMOUNT", "'16'"),
    (["convert", "nan", "acu", "--to", "huawei/Ascend910B2"], "AMOUNT", "'nan'"),
    (["convert", "1", "flops", "--to", "huawei/Ascend910B2"], "UNIT", "'flops'"),
    (["convert", "1", "nvidia/A100-80G", "--to", "nvidia/B9000"], "--to", "'nvidia/B9000'"),
    (["models", "--vendor", "acme"], "--vendor", "'acme'"),
    (["top", "--once", "--nats-url", ""], "--nats-url", "''"),
    (["top", "--once", "--nats-url", "http://127.0.0.1:4222"], "--nats-url", "'http://"),
    (["top", "--once", "--nats-url", "nats://127.0.0.1:99999"], "--nats-url", "99999"),
]


def _assert_usage_error(done: Done, *, flag: str, value: str) -> None:
    assert done.code == 2, (done.code, done.out, done.err)
    assert len(done.err_lines) == 1, done.err
    assert flag in done.err and value in done.err, done.err
    assert "Traceback" not in done.err
    assert done.seconds < CEILING_S


@pytest.mark.parametrize(("argv", "flag", "value"), BAD_FLAGS, ids=lambda a: " ".join(a))
def test_a_bad_flag_is_one_line_naming_flag_and_value_and_exit_2(
    argv: list[str], flag: str, value: str
) -> None:
    _assert_usage_error(hcs(*NOWHERE, *argv), flag=flag, value=value)


def test_vram_without_a_unit_is_called_ambiguous() -> None:
    done = hcs("place", "--vram", "16", *NOWHERE)
    assert "ambiguous" in done.err and "16Gi" in done.err, done.err


def test_a_place_that_asks_for_nothing_names_the_flags_to_use() -> None:
    done = hcs("place", *NOWHERE)
    assert done.code == 2 and len(done.err_lines) == 1, done.err
    assert "--vram" in done.err and "--devices" in done.err


def test_certs_into_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    done = hcs("certs", "--out", str(a_file / "certs"))
    _assert_usage_error(done, flag="--out", value=str(a_file))


def test_a_settings_file_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    done = hcs("top", "--once", "--config", str(missing))
    _assert_usage_error(done, flag=str(missing), value="")


def test_a_bad_url_is_quoted_without_its_password() -> None:
    done = hcs("top", "--nats-url", "nats://hcs:s3cret@127.0.0.1:99999")
    _assert_usage_error(done, flag="--nats-url", value="nats://hcs:***@127.0.0.1:99999")
    assert "s3cret" not in done.err
