import java.io.BufferedReader;
import java.io.FileReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Collections;
import java.util.Properties;

import io.delta.storage.LogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * Test harness: one writer process in the forced log-store race (tests/integration/test_two_writers.py).
 *
 * <p>Args: LOG_STORE_CLASS HADOOP_CONF_PROPERTIES WRITER_ID. Prints "ready", then for each stdin line
 * "PATH START_EPOCH_MS" spins until START_EPOCH_MS, writes one line naming this writer to PATH with
 * overwrite=false, and prints "PATH won", "PATH lost [CAUSE]" (FileAlreadyExistsException) or "PATH error ...".
 */
public final class LogStoreRace {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileReader reader = new FileReader(args[1], StandardCharsets.UTF_8)) {
            props.load(reader);
        }
        Configuration conf = new Configuration();
        for (String key : props.stringPropertyNames()) {
            conf.set(key, props.getProperty(key));
        }
        LogStore store = (LogStore) Class.forName(args[0]).getConstructor(Configuration.class).newInstance(conf);
        String writer = args[2];
        System.out.println("ready");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.trim().split(" ");
            Path path = new Path(parts[0]);
            long start = Long.parseLong(parts[1]);
            String content = "{\"commitInfo\":{\"writer\":\"" + writer + "\",\"path\":\"" + parts[0] + "\"}}";
            while (System.currentTimeMillis() < start) {
                Thread.onSpinWait();
            }
            String outcome;
            try {
                store.write(path, Collections.singletonList(content).iterator(), false, conf);
                outcome = "won";
            } catch (FileAlreadyExistsException e) {
                Throwable cause = e.getCause();
                outcome = "lost" + (cause == null ? "" : " " + cause.getClass().getSimpleName());
            } catch (Exception e) {
                outcome = ("error " + e).replace('\n', ' ');
            }
            System.out.println(parts[0] + " " + outcome);
            System.out.flush();
        }
    }
}
