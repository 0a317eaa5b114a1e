"""Input files that are not what they claim (not UTF-8, not YAML, not JSON): every command
that reads one ends in one error line naming the file, the problem and where it is, with
exit code 2 and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan._yaml import read_mapping
from capplan.cli import main
from capplan.errors import ConfigError

NOT_UTF8 = b"schema_version: 1\nname: \xff\xfe\x80bad\n"


def _one_error_line(args: list[str]) -> str:
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output  # an uncaught exception would be 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


@pytest.mark.parametrize("command", [
    ["size", "--quick", "--traffic"],
    ["simulate", "--pool", "chat", "--replicas", "1", "--traffic"],
    ["validate", "predict"],
    ["report", "--out", "r.html"],
    ["deploy"],
])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_not_utf8_is_one_line_with_the_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str], suffix: str
) -> None:
    """Rule: bad input is one line naming the file and the fix. A file that is not UTF-8
    says so, with the offset and line of the first bad byte (was a UnicodeDecodeError
    traceback in every command)."""
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / f"x{suffix}"
    bad.write_bytes(NOT_UTF8)
    line = _one_error_line([*command, str(bad)])
    assert f"{bad}: not UTF-8 text (byte 0xff at offset 24, line 2)" in line
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(("text", "says"), [
    ("schema_version: 1\nname: x\npools: [\n  - name: a\n",
     "not valid YAML: expected the node content, but found '-' (line 4, column 3)"),
    ("schema_version: 1\nname: x\n\tpools: []\n",
     "not valid YAML: found character '\\t' that cannot start any token (line 3, column 1)"),
    ('schema_version: 1\nname: "unterminated\n',
     "not valid YAML: found unexpected end of stream (line 3, column 1), while scanning a "
     "quoted scalar that began at line 2, column 7"),
    ("schema_version: 1\nschema_version: 1\n",
     "not valid YAML: key 'schema_version' given twice (lines 1 and 2); keep one "
     "(line 2, column 1)"),
])
def test_yaml_syntax_error_says_what_and_where(tmp_path: Path, text: str, says: str) -> None:
    """Rule: a YAML error names the problem and its line and column, not PyYAML's first
    line ('while parsing a flow node'), which says neither."""
    bad = tmp_path / "mix.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_mapping(bad)
    assert str(err.value) == f"{bad}: {says}"
    assert says in _one_error_line(["size", "--quick", "--traffic", str(bad)])


def test_json_syntax_error_says_where(tmp_path: Path) -> None:
    """Rule: a JSON error names the problem with its line and column on one line."""
    bad = tmp_path / "mix.json"
    bad.write_text('{"schema_version": 1,\n "name": }\n')
    with pytest.raises(ConfigError, match=r"not valid JSON: Expecting value \(line 2, column 10\)"):
        read_mapping(bad)


@pytest.mark.parametrize(("name", "fmt"), [("bench.json", "vllm-bench"), ("m.prom", "metrics")])
def test_not_utf8_trace_is_one_line(tmp_path: Path, name: str, fmt: str) -> None:
    """The bench-result and metrics readers of `traffic from-trace` say a file is not UTF-8
    too (they were UnicodeDecodeError tracebacks)."""
    bad = tmp_path / name
    bad.write_bytes(b'{"completed": 1}\n\xff\n')
    line = _one_error_line(["traffic", "from-trace", str(bad), "--format", fmt,
                            "--rate-rps", "1"])
    assert f"{bad}: not UTF-8 text (byte 0xff at offset 17, line 2)" in line


@pytest.mark.parametrize(("text", "where"), [
    (b"timestamp,prompt_tokens,output_tokens,user\n0.0,100,20,caf\xe9\n1.0,200,30,b\n",
     "byte 0xe9 at offset 57, line 2"),
    (b"timest\xe9mp,prompt_tokens,output_tokens\n0.0,100,20\n1.0,200,30\n",
     "byte 0xe9 at offset 6, line 1"),
    (b"timestamp,prompt_tokens,output_tokens\n0.0,100,20\n1.0,2\xe900,30\n2,3,4\n",
     "byte 0xe9 at offset 54, line 3"),
])
def test_not_utf8_csv_trace_says_where(tmp_path: Path, text: bytes, where: str) -> None:
    """A CSV trace with a Latin-1 byte in a value, a header or a number: polars reads the
    header lossily and says only "invalid utf-8 sequence", so the error was a missing
    column named with a replacement character, or a parse error with no place."""
    bad = tmp_path / "t.csv"
    bad.write_bytes(text)
    line = _one_error_line(["traffic", "from-trace", str(bad), "--model", "llama-3.1-8b"])
    assert line == f"error: {bad}: not UTF-8 text ({where}); save the file as UTF-8"


@pytest.mark.parametrize(("text", "where"), [
    (b"arrival_s,input_tokens,output_tokens,note\n0.0,100,20,caf\xe9\n1.0,200,30,b\n",
     "byte 0xe9 at offset 56, line 2"),
    (b"arriv\xe9l_s,input_tokens,output_tokens\n0.0,100,20\n", "byte 0xe9 at offset 5, line 1"),
    (b"arrival_s,input_tokens,output_tokens\n0.0,100,20\n1.0,2\xe900,30\n",
     "byte 0xe9 at offset 53, line 3"),
])
def test_not_utf8_replay_file_says_where(tmp_path: Path, text: bytes, where: str) -> None:
    """The replay file a traffic mix names, read by `capplan size`, the same way."""
    (tmp_path / "r.csv").write_bytes(text)
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "schema_version: 1\npools:\n  - {name: p, model: llama-3.1-8b}\nworkloads:\n"
        "  - {name: chat, pool: p, arrival: {kind: replay, path: r.csv}, "
        "slo: {ttft_p95_s: 1}}\n")
    line = _one_error_line(["size", "--quick", "--traffic", str(mix)])
    assert line == f"error: {tmp_path / 'r.csv'}: not UTF-8 text ({where}); save the file as UTF-8"


@pytest.mark.parametrize(("field", "text"), [
    ("workloads.0.arrival.poisson.rate_rps", "{kind: poisson, rate_rps: yes}"),
    ("workloads.0.arrival.closed.concurrency", "{kind: closed, concurrency: true}"),
])
def test_yes_no_where_a_number_is_due(tmp_path: Path, field: str, text: str) -> None:
    """YAML reads `yes` and `true` as booleans, and pydantic took them as 1: `rate_rps: yes`
    sized a pool for one request a second."""
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "schema_version: 1\npools:\n  - {name: p, model: llama-3.1-8b}\nworkloads:\n"
        f"  - {{name: chat, pool: p, arrival: {text}, input_tokens: {{kind: constant, value: 9}},"
        " output_tokens: {kind: constant, value: 9}, slo: {ttft_p95_s: 1}}\n")
    line = _one_error_line(["size", "--quick", "--traffic", str(mix)])
    assert line == f"error: {mix}: {field}: true is a yes/no, not a value: give a number"


def test_yes_no_where_a_yes_no_is_due_still_reads() -> None:
    """Fields that are yes/no keep taking them (and the refusal names no such field)."""
    from capplan.pool import EngineConfig
    assert EngineConfig(enable_prefix_caching=False).enable_prefix_caching is False


def test_a_negative_seed_is_refused_not_a_traceback(tmp_path: Path) -> None:
    """numpy's SeedSequence takes no negative seed: `--seed -1` and `seed: -3` ended in its
    traceback ("expected non-negative integer")."""
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "schema_version: 1\npools:\n  - {name: p, model: llama-3.1-8b}\nworkloads:\n"
        "  - {name: chat, pool: p, arrival: {kind: poisson, rate_rps: 1}, input_tokens: "
        "{kind: constant, value: 9}, output_tokens: {kind: constant, value: 9}, "
        "slo: {ttft_p95_s: 1}}\nsimulation: {duration_s: 5, seed: -3}\n")
    line = _one_error_line(["simulate", "--pool", "p", "--replicas", "1", "--traffic", str(mix)])
    assert line.startswith(f"error: {mix}: simulation.seed: ") and "0" in line
    for args in (["simulate", "--pool", "chat", "--replicas", "1"], ["size", "--quick"]):
        res = CliRunner().invoke(main, [*args, "--traffic",
                                        str(Path(__file__).parents[1] / "examples/chat-only.yaml"),
                                        "--seed", "-1"])
        assert res.exit_code == 2 and "'--seed': -1 is not in the range x>=0" in res.output


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_an_empty_file_says_it_is_empty(tmp_path: Path, suffix: str) -> None:
    """An empty YAML file read as null ("expected a mapping at the top level"), an empty JSON
    file as a decoding error at line 1, column 1; both say what is wrong: nothing is in it."""
    path = tmp_path / f"mix{suffix}"
    path.write_text("\n  \n")
    line = _one_error_line(["size", "--quick", "--traffic", str(path)])
    assert line == f"error: {path}: the file is empty; check the path, and that the file was saved"


@pytest.mark.parametrize(("slo", "says"), [
    ("{ttft_p0_s: 1}", "SLO key 'ttft_p0_s': the percentile must lie between 0 and 100"),
    ("{ttft_p99_s: yes}", "SLO ttft_p99_s must be a positive number of seconds"),
    ("[ttft_p99_s]", "write SLOs as a mapping of key to seconds"),
])
def test_slo_mistakes_name_the_key_not_the_model(tmp_path: Path, slo: str, says: str) -> None:
    """p0 named pydantic's path (`slo.targets.0.percentile: Input should be greater than 0`),
    a list its class (`instance of Slo`), and `yes` was taken as a one-second limit."""
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "schema_version: 1\npools:\n  - {name: p, model: llama-3.1-8b}\nworkloads:\n"
        "  - {name: chat, pool: p, arrival: {kind: poisson, rate_rps: 1}, input_tokens: "
        "{kind: constant, value: 9}, output_tokens: {kind: constant, value: 9}, "
        f"slo: {slo}}}\n")
    line = _one_error_line(["size", "--quick", "--traffic", str(mix)])
    assert line.startswith(f"error: {mix}: workloads.0.slo: {says}"), line
