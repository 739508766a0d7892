"""The stack's own S3 mirror of model weights, and S3's bucket naming rules."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from config.schema.base import StrictModel

S3_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")


class ModelMirrorConfig(StrictModel):
    enabled: bool = Field(
        default=False,
        description=(
            "Create an S3 bucket for model weights, readable by the Ray pods and writable by `make mirror-model`'s "
            "Job. Point serving.model.source at s3://<bucket>/<model_id> once the model is mirrored."
        ),
    )
    bucket_name: str | None = Field(
        default=None,
        description="The bucket's name; left empty: <name>-models-<account>-<region>, which is unique per account.",
    )
    keep_on_destroy: bool | None = Field(
        default=None,
        description=(
            "Keep the bucket and its weights when the stack is destroyed (copying a model again takes an hour). "
            "Left empty: kept in production, emptied and deleted elsewhere."
        ),
    )

    @field_validator("bucket_name")
    @classmethod
    def _s3_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problem = s3_bucket_name_problem(value)
        if problem:
            raise ValueError(f"{value!r} is a name S3 refuses: {problem}")
        return value


def s3_bucket_name_problem(name: str) -> str | None:
    """S3's bucket naming rules (general purpose buckets), as a fix to apply, or None."""
    if not 3 <= len(name) <= 63:
        return "use 3-63 characters"
    if not S3_BUCKET_NAME.match(name):
        return "use lower-case letters, digits, '.' and '-', starting and ending with a letter or digit"
    if ".." in name:
        return "no two dots in a row"
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "not an IP address"
    if name.startswith(("xn--", "sthree-", "amzn-s3-demo-")):
        return "do not start with 'xn--', 'sthree-' or 'amzn-s3-demo-'"
    if name.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")):
        return "do not end with '-s3alias', '--ol-s3', '.mrap', '--x-s3' or '--table-s3'"
    return None
