"""Loading a config file into :class:`AppConfig`, with errors a person can act on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from config.schema import AppConfig

CONFIG_DIR = Path(__file__).resolve().parent


class ConfigError(Exception):
    """A config file is wrong; ``problems`` holds one actionable line per mistake."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def config_path_for(env: str) -> Path:
    path = CONFIG_DIR / f"{env}.yaml"
    if env.startswith("local"):
        raise ConfigError(
            str(path), ["this is the serving spec that `make local` runs, not an environment; use ENV=dev"]
        )
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if not p.stem.startswith("local"))
        raise ConfigError(str(path), [f"no environment {env!r}; use one of {', '.join(known)} or CONFIG=path.yaml"])
    return path


# An unknown key that names a secret: someone is about to write its value into the config.
SECRET_LIKE_KEY = re.compile(r"(token|password|secret|api_?key|credential)s?$", re.IGNORECASE)


def _field_path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys a model accepts at ``loc``, for the 'unknown key' message."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if current is None or isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None) if field else None
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return sorted(current.model_fields) if current else []


def describe_validation_error(model: type[BaseModel], error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        loc = item["loc"]
        where = _field_path(loc)
        kind = item["type"]
        if kind == "extra_forbidden" and SECRET_LIKE_KEY.search(str(loc[-1])):
            problems.append(
                f"{where}: a secret is never a config value (it would be in the repository and the template); "
                "remove it: Ray's own token is made per cluster by KubeRay (ray_service.auth_token_generation "
                "rotates it), API keys are named by their Secrets Manager secrets "
                "(ray_service.endpoint.api_key_secrets), a Hugging Face token by serving.model.hf_token_secret"
            )
        elif kind == "extra_forbidden":
            allowed = _allowed_keys(model, loc)
            problems.append(f"{where}: unknown key; remove it (allowed here: {', '.join(allowed)})")
        elif kind == "missing":
            problems.append(f"{where}: required; add it")
        elif kind == "value_error":
            problems.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
        else:
            problems.append(f"{where}: {item['msg']} (got {item.get('input')!r})")
    return problems


def parse_config(data: object, *, source: str = "<config>") -> AppConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, ["the file must hold a YAML mapping of settings"])
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, describe_validation_error(AppConfig, exc)) from None


def load_config(path: str | Path) -> AppConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), ["file not found"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {exc}"]) from None
    return parse_config(data, source=str(path))


def load_config_or_exit(path: str | Path) -> AppConfig:
    """load_config for a command line: a bad config prints its problems and exits with status 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"Config error:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None
