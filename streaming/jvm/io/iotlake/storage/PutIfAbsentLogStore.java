package io.iotlake.storage;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * A Delta {@link io.delta.storage.LogStore} for S3A that commits with a conditional PUT
 * ({@code If-None-Match: *}), so that two driver processes writing one table can't overwrite each
 * other's commit.
 *
 * <p>Delta's S3 store ({@code S3SingleDriverLogStore}) checks "does version N exist?" and then
 * PUTs; its lock lives in one JVM, so a second process can pass the same check and silently
 * overwrite the commit. Here the object store decides: the first PUT of {@code N.json} wins, the
 * second gets HTTP 412, which S3A reports at {@code close()} as
 * {@link RemoteFileChangedException}. This store turns that into
 * {@link FileAlreadyExistsException}, the signal Delta's optimistic transaction uses to check for
 * conflicts and retry at the next version.
 *
 * <p>Needs Hadoop S3A 3.4.2+ with {@code fs.s3a.create.conditional.enabled=true} (the default) and
 * a store that honours {@code If-None-Match} (AWS S3, MinIO). Any other file system is refused
 * with an {@link IOException} instead of being written unsafely. Select it with
 * {@code spark.delta.logStore.s3a.impl=io.iotlake.storage.PutIfAbsentLogStore}.
 */
public class PutIfAbsentLogStore extends HadoopFileSystemLogStore {

    /** The mandatory create option that makes S3A send {@code If-None-Match: *}. */
    public static final String CONDITIONAL_OVERWRITE = "fs.option.create.conditional.overwrite";

    public PutIfAbsentLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (overwrite) {
            // Only for files Delta rewrites on purpose (_last_checkpoint): a plain overwrite.
            try (FSDataOutputStream out = fs.create(path, true)) {
                writeLines(out, actions);
            }
            return;
        }
        if (!fs.hasPathCapability(path, CONDITIONAL_OVERWRITE)) {
            throw new IOException(String.format(
                "PutIfAbsentLogStore can't commit %s: %s has no conditional create (%s). Use an s3a:// "
                    + "path on S3A with fs.s3a.create.conditional.enabled=true, or set "
                    + "storage.log_store: single_driver and run only one writer process.",
                path, fs.getClass().getName(), CONDITIONAL_OVERWRITE));
        }
        try {
            FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path);
            builder.overwrite(false);
            builder.must(CONDITIONAL_OVERWRITE, true);
            FSDataOutputStream out = builder.build();
            try {
                writeLines(out, actions);
            } finally {
                out.close(); // the PUT happens here; a lost race surfaces here
            }
        } catch (RemoteFileChangedException | org.apache.hadoop.fs.FileAlreadyExistsException e) {
            // 412 at close(), or S3A's own existence probe at create(): another writer has version N.
            FileAlreadyExistsException lost = new FileAlreadyExistsException(path.toString());
            lost.initCause(e);
            throw lost;
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false; // an S3 PUT is all or nothing
    }

    private static void writeLines(FSDataOutputStream out, Iterator<String> actions) throws IOException {
        while (actions.hasNext()) {
            out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
    }
}
