"""Finds secret material in text: token shapes of the services this project touches."""

from __future__ import annotations

import re

SECRET_PATTERNS = {
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "AWS access key id": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret access key": re.compile(r"(?i)aws_secret_access_key\W{0,5}[A-Za-z0-9/+=]{40}"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "inline secret value": re.compile(r'"SecretString"\s*:'),
    "token variable with a value": re.compile(r"(?i)\b(HF_TOKEN|HUGGING_FACE_HUB_TOKEN)\b\W{1,6}[A-Za-z0-9_]{8,}"),
}


def find_secrets(text: str) -> list[str]:
    return [
        f"{name}: {match.group(0)[:12]}…"
        for name, pattern in SECRET_PATTERNS.items()
        for match in pattern.finditer(text)
    ]
