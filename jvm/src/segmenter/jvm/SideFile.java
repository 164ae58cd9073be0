package segmenter.jvm;

import java.io.BufferedOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.channels.Channels;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.List;

import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.StructType;

/**
 * The groups of one task that are not clean, written for the Python judge's second job
 * (reassembly/spark/batch/save.py reads them), so that the job writing the clean messages has no Python
 * operator at all: a clean row is never queued beside a Python call, never exploded.
 *
 * <p>One file per task attempt, {@code <partition>-<attempt>-<taskAttemptId>.tmp} in {@code dir},
 * created at the first group that is not clean (a clean partition leaves no file) and renamed to
 * {@code .side} once the task's input is exhausted; an attempt that fails leaves no {@code .side}
 * (its {@code .tmp} is deleted when the task completes). Two attempts of one partition that both
 * finish (speculation) read the same sorted shuffle input, so their files hold the same groups: the
 * reader takes one per partition.
 *
 * <p>Format, big-endian: per group {@code u8 routable, u8 large, i32 rows}, then per row
 * {@code i64 length} (-1: a NULL input row) and that many bytes: the row's original bytes, its header
 * (from the meta {@code sk}, after {@code skHeader} bytes of sort prefix) and its piece, in sort
 * order, as {@code judge.originals} rebuilds them; a far row's stub (its piece travels in its own
 * per-offset group) is left out. {@code large}: a per-offset group, or a group with far rows.
 *
 * <p>Lineage: with kept columns ({@code src}, a field of the meta struct), the rows' kept columns go
 * to {@code <name>.src} beside it, one per row written, in the same order: an Arrow IPC stream written
 * by Spark's own Arrow writer (the types Spark hands a Python UDF), batches of {@link #SOURCE_BATCH}
 * rows. It is renamed into place before the side file, so a {@code .side} has its {@code .src}.
 */
final class SideFile {
    private static final int SOURCE_BATCH = 4096;

    private final Path dir;
    private final int skHeader, sk, far, isNull, plen;
    private final int src; // negative: nothing kept
    private final StructType srcType;
    private DataOutputStream out;
    private Path tmp;
    private boolean finished;
    private ArrowWriter sources; // the kept columns of the rows written, or null
    private ArrowStreamWriter sourceStream;
    private OutputStream sourceOut;
    private Path sourceTmp;
    private int batched; // rows in the current batch of sources

    SideFile(String dir, int skHeader, int sk, int far, int isNull, int plen, int src, StructType srcType) {
        this.dir = Paths.get(dir);
        this.skHeader = skHeader;
        this.sk = sk;
        this.far = far;
        this.isNull = isNull;
        this.plen = plen;
        this.src = src;
        this.srcType = srcType;
    }

    private static boolean flag(InternalRow m, int i) {
        return !m.isNullAt(i) && m.getBoolean(i);
    }

    /** One group's rows; {@code pieces} holds their pieces back to back, in the order of {@code metas}. */
    void write(boolean routable, boolean perOffset, List<InternalRow> metas, byte[] pieces) {
        try {
            if (out == null) {
                open();
            }
            int rows = 0;
            boolean large = perOffset;
            for (InternalRow m : metas) {
                if (flag(m, far)) {
                    large = true;
                } else {
                    rows++;
                }
            }
            out.writeByte(routable ? 1 : 0);
            out.writeByte(large ? 1 : 0);
            out.writeInt(rows);
            int pos = 0;
            for (InternalRow m : metas) {
                int length = m.getInt(plen);
                if (flag(m, far)) {
                    pos += length;
                    continue;
                }
                if (sources != null) {
                    source(m);
                }
                if (flag(m, isNull)) {
                    out.writeLong(-1);
                    continue;
                }
                if (routable) {
                    byte[] key = m.getBinary(sk);
                    out.writeLong((long) key.length - skHeader + length);
                    out.write(key, skHeader, key.length - skHeader);
                } else {
                    out.writeLong(length);
                }
                out.write(pieces, pos, length);
                pos += length;
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private void open() throws IOException {
        String name = TaskFiles.attemptName();
        Files.createDirectories(dir);
        tmp = dir.resolve(name + ".tmp");
        out = new DataOutputStream(new BufferedOutputStream(Files.newOutputStream(tmp), 1 << 20));
        if (src >= 0) {
            sourceTmp = dir.resolve(name + ".srctmp");
            sourceOut = new BufferedOutputStream(Files.newOutputStream(sourceTmp), 1 << 16);
            sources = ArrowWriter.create(srcType, "UTC", true, false);
            sourceStream = new ArrowStreamWriter(sources.root(), null, Channels.newChannel(sourceOut));
            sourceStream.start();
        }
        TaskFiles.onCompletion(this::abandon);
    }

    /** One row's kept columns into the sources stream (a batch written every {@link #SOURCE_BATCH} rows). */
    private void source(InternalRow m) throws IOException {
        sources.write(m.getStruct(src, srcType.size()));
        if (++batched == SOURCE_BATCH) {
            flushSources();
        }
    }

    private void flushSources() throws IOException {
        if (batched > 0) {
            sources.finish();
            sourceStream.writeBatch();
            sources.reset();
            batched = 0;
        }
    }

    private void closeSources() throws IOException {
        if (sourceStream != null) {
            try {
                sourceStream.close();
                sourceOut.close();
            } finally {
                sources.root().close();
                sourceStream = null;
            }
        }
    }

    /** The task's input has ended: the file becomes visible to the reader (nothing if no group was written). */
    void finish() {
        if (out == null || finished) {
            return;
        }
        try {
            if (sourceStream != null) {
                flushSources();
                sourceStream.end();
                closeSources();
                String name = sourceTmp.getFileName().toString();
                Files.move(sourceTmp, sourceTmp.resolveSibling(name.substring(0, name.length() - 6) + "src"),
                    StandardCopyOption.ATOMIC_MOVE);
            }
            out.close();
            String name = tmp.getFileName().toString();
            Files.move(tmp, tmp.resolveSibling(name.substring(0, name.length() - 4) + ".side"),
                StandardCopyOption.ATOMIC_MOVE);
            finished = true;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** After the task: an attempt that did not reach the end of its input leaves nothing. */
    private void abandon() {
        if (finished) {
            return;
        }
        try {
            out.close();
            Files.deleteIfExists(tmp);
            closeSources();
            if (sourceTmp != null) {
                Files.deleteIfExists(sourceTmp);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
