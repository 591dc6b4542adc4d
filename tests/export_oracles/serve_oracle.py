"""Test-only oracles for ``partita serve --export``: the serving engines' accepted arguments.

:data:`TABLE` (serve_engines.json) transcribes, with repository, commit and path, the flags
vLLM (``EngineArgs.add_cli_args``) and SGLang (``ServerArgs``) declare for what the exporter
emits - names, aliases, value types, choices - and MindIE's documented ``config.json`` schema
(keys, types, ranges, cross-field rules). :func:`engine_parser` rebuilds an argparse parser
from a table, so an unknown flag, a missing value, a wrong type or a value outside the choices
fails as it would in the engine's own parser; :func:`check_mindie` walks a config against the
documented schema. Neither engine installs here (CUDA/NPU builds), hence the transcription.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

TABLE = json.loads(Path(__file__).with_name("serve_engines.json").read_text())
_TYPES = {"int": int, "float": float, "str": str, "json": json.loads}


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of exiting, so a test sees the message
        raise _Refused(message)


def engine_parser(engine: str) -> argparse.ArgumentParser:
    """An argparse parser with ``engine``'s (vllm | sglang) flags from :data:`TABLE`."""
    spec = TABLE[engine]
    parser = _Parser(prog=engine, allow_abbrev=False)
    if engine == "vllm":
        parser.add_argument("model")
    for flag, opt in spec["options"].items():
        names = [flag, *opt.get("aliases", [])]
        action = opt.get("action")
        if action == "store_true":
            parser.add_argument(*names, action="store_true")
        elif action == "boolean_optional":
            parser.add_argument(*names, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(*names, type=_TYPES[opt["type"]], choices=opt.get("choices"))
    return parser


def parse(engine: str, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` (without the program) with the engine's table; raises on a refusal."""
    return engine_parser(engine).parse_args(argv)


def check_kv_transfer(config: dict) -> None:
    """vLLM's KVTransferConfig: known fields only, a role from its Literal, a role with a connector."""
    spec = TABLE["vllm"]
    unknown = set(config) - set(spec["kv_transfer_config_fields"])
    assert not unknown, f"unknown KVTransferConfig fields {unknown}"
    assert config.get("kv_role") in spec["kv_roles"], config.get("kv_role")
    assert config.get("kv_connector"), "a connector needs a role and vice versa"


def _check_value(where: str, value, rule) -> None:
    kind = rule if isinstance(rule, str) else rule["type"]
    checks = {"str": str, "int": int, "bool": bool, "map": dict}
    if kind in checks:
        ok = isinstance(value, checks[kind]) and not (kind == "int" and isinstance(value, bool))
        assert ok, f"{where}: {value!r} is not {kind}"
    elif kind == "list_of_int_lists":
        assert isinstance(value, list), where
        assert all(isinstance(x, list) and all(isinstance(i, int) for i in x) for x in value), where
    elif kind == "list_of_maps":
        assert isinstance(value, list) and all(isinstance(x, dict) for x in value), where
    if isinstance(rule, dict):
        if "choices" in rule:
            assert value in rule["choices"], f"{where}: {value!r} not in {rule['choices']}"
        if "min" in rule:
            assert value >= rule["min"], f"{where}: {value} < {rule['min']}"
        if "max" in rule:
            assert value <= rule["max"], f"{where}: {value} > {rule['max']}"


def _check_section(name: str, section: dict) -> None:
    schema = TABLE["mindie"]["sections"][name]
    unknown = set(section) - set(schema)
    assert not unknown, f"{name}: keys not in MindIE's schema: {unknown}"
    for key, value in section.items():
        _check_value(f"{name}.{key}", value, schema[key])


def check_mindie(config: dict) -> None:
    """Every key of a MindIE ``config.json`` against the documented schema and its
    cross-field rules (serve_engines.json ``cross_field_rules``)."""
    assert set(config) <= {"Version", "ServerConfig", "BackendConfig", "LogConfig"}, set(config)
    _check_section("ServerConfig", config["ServerConfig"])
    backend = config["BackendConfig"]
    _check_section("BackendConfig", backend)
    deploy, sched = backend["ModelDeployConfig"], backend["ScheduleConfig"]
    _check_section("ModelDeployConfig", deploy)
    _check_section("ScheduleConfig", sched)
    for model in deploy["ModelConfig"]:
        _check_section("ModelConfig", model)
        assert all(model["worldSize"] == len(ids) for ids in backend["npuDeviceIds"]), "worldSize != NPUs per instance"
    assert deploy["maxInputTokenLen"] <= deploy["maxSeqLen"] - 1
    assert sched["maxPrefillTokens"] >= deploy["maxInputTokenLen"]
    assert sched["maxPrefillBatchSize"] <= sched["maxBatchSize"]
    assert sched["maxIterTimes"] <= deploy["maxSeqLen"]
    assert sched["maxPreemptCount"] <= sched["maxBatchSize"]
    block = sched["cacheBlockSize"]
    assert block == 128 or block % 16 == 0
