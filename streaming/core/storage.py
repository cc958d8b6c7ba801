"""How each client reaches the configured storage: Hadoop S3A options for Spark (the writer's key, never the root
user), and delta-rs options and URIs for the commands that run without a JVM. No pyspark here."""

from __future__ import annotations

from streaming.core.config import Settings, resolve_path
from streaming.core.errors import CredentialsError


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


def storage_credentials(settings: Settings) -> dict[str, str]:
    """The writer's key (never the root user) as Hadoop options, for the running JVM (see build_session)."""
    s = settings.storage
    if not s.is_s3:
        return {}
    if not s.access_key or not s.secret_key:
        raise CredentialsError(
            "No S3 credentials for the writer. Run `make up` (it generates the keys into "
            f"{resolve_path(s.secrets_file)}), or set IOTLAKE_STORAGE__ACCESS_KEY and IOTLAKE_STORAGE__SECRET_KEY."
        )
    return {"fs.s3a.access.key": s.access_key, "fs.s3a.secret.key": s.secret_key}


def storage_conf(settings: Settings) -> dict[str, str]:
    """S3A options for the object store, without credentials (storage_credentials has those)."""
    s = settings.storage
    if not s.is_s3:
        return {}
    return {
        "spark.hadoop.fs.s3a.endpoint": s.endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": s.region,
        "spark.hadoop.fs.s3a.path.style.access": str(s.path_style_access).lower(),
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(s.ssl_enabled).lower(),
    }
