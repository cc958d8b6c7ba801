"""Small files in the checkpoint through Hadoop's FileSystem (local paths and s3a:// alike), via the session's JVM."""

from __future__ import annotations

from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

# S3A's conditional create (Hadoop 3.4.2+): If-None-Match: * for a new object, If-Match: <etag> for an overwrite.
CONDITIONAL_OVERWRITE = "fs.option.create.conditional.overwrite"
CONDITIONAL_OVERWRITE_ETAG = "fs.option.create.conditional.overwrite.etag"
# What S3A raises when the object store refuses a conditional PUT (412), or its own existence probe finds the file.
LOST_RACE = ("RemoteFileChangedException", "FileAlreadyExistsException", "PreconditionFailed")


class HadoopFiles:
    """Files under one directory: read, write, create-if-absent, list, delete."""

    def __init__(self, spark: SparkSession, directory: str) -> None:
        jvm: Any = spark._jvm
        jsc: Any = spark._jsc
        self._jvm = jvm
        self.directory = directory.rstrip("/")
        self._dir = jvm.org.apache.hadoop.fs.Path(self.directory)
        self.fs = self._dir.getFileSystem(jsc.hadoopConfiguration())

    def path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._dir, name)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def read_text(self, name: str) -> str | None:
        """The file's text, or None when it does not exist or was cut short by a kill (a local checksum error)."""
        path = self.path(name)
        try:
            stream = self.fs.open(path)
            try:
                return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
            finally:
                stream.close()
        except Py4JJavaError as e:
            text = str(e.java_exception)
            if "FileNotFoundException" in text or "ChecksumException" in text:
                return None
            raise

    def write_text(self, name: str, text: str) -> None:
        """Write (or overwrite) the file with a plain create: no guarantee against a concurrent writer."""
        out = self.fs.create(self.path(name), True)
        try:
            out.write(text.encode())
        finally:
            out.close()

    def conditional_put(self, name: str, text: str, etag: str | None = None) -> bool:
        """Create the file only if it is absent (etag None), or replace it only if it still has `etag`.

        False when another writer won. Needs a file system with conditional create (S3A on AWS S3 or MinIO).
        """
        builder = self.fs.createFile(self.path(name)).overwrite(etag is not None)
        if etag is None:
            builder.must(CONDITIONAL_OVERWRITE, True)
        else:
            builder.must(CONDITIONAL_OVERWRITE_ETAG, etag)
        try:
            out = builder.build()
            try:
                out.write(text.encode())
            finally:
                out.close()  # the PUT happens here: a lost race surfaces here
        except Py4JJavaError as e:
            if any(marker in str(e.java_exception) for marker in LOST_RACE):
                return False
            raise
        return True

    def etag(self, name: str) -> str | None:
        status = self.fs.getFileStatus(self.path(name))
        getter = getattr(status, "getEtag", None)
        return str(getter()) if getter is not None else None

    def supports_conditional_put(self) -> bool:
        return bool(self.fs.hasPathCapability(self._dir, CONDITIONAL_OVERWRITE))

    def names(self, subdirectory: str) -> list[str]:
        """File names directly under `subdirectory` (empty when it does not exist)."""
        path = self.path(subdirectory)
        if not self.fs.exists(path):
            return []
        return [str(status.getPath().getName()) for status in self.fs.listStatus(path)]

    def delete(self, name: str, recursive: bool = False) -> None:
        self.fs.delete(self.path(name), recursive)
