"""Options for delta-rs (the Rust Delta reader the no-JVM commands use) on the configured storage."""

from __future__ import annotations

from streaming.config import Settings


def delta_storage_options(settings: Settings, access_key: str | None = None, secret_key: str | None = None) -> dict:
    """delta-rs (object_store) options for the configured S3 endpoint."""
    s = settings.storage
    if not s.is_s3:
        return {}
    return {
        "AWS_ENDPOINT_URL": s.endpoint,
        "AWS_REGION": s.region,
        "AWS_ACCESS_KEY_ID": access_key or s.access_key or "",
        "AWS_SECRET_ACCESS_KEY": secret_key or s.secret_key or "",
        "AWS_ALLOW_HTTP": str(not s.ssl_enabled).lower(),
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not s.path_style_access).lower(),
    }


def delta_rs_uri(uri: str) -> str:
    return "s3://" + uri.removeprefix("s3a://") if uri.startswith("s3a://") else uri
