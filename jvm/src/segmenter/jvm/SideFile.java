package segmenter.jvm;

import java.io.BufferedOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.List;

import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.util.TaskCompletionListener;

/**
 * The groups of one task that are not clean, written for the Python judge's second job
 * (reassembly/spark/save.py reads them), so that the job writing the clean messages has no Python
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
 */
final class SideFile {
    private final Path dir;
    private final int skHeader, sk, far, isNull, plen;
    private DataOutputStream out;
    private Path tmp;
    private boolean finished;

    SideFile(String dir, int skHeader, int sk, int far, int isNull, int plen) {
        this.dir = Paths.get(dir);
        this.skHeader = skHeader;
        this.sk = sk;
        this.far = far;
        this.isNull = isNull;
        this.plen = plen;
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
        TaskContext ctx = TaskContext.get();
        String name = ctx == null ? "local-0-0"
            : ctx.partitionId() + "-" + ctx.attemptNumber() + "-" + ctx.taskAttemptId();
        Files.createDirectories(dir);
        tmp = dir.resolve(name + ".tmp");
        out = new DataOutputStream(new BufferedOutputStream(Files.newOutputStream(tmp), 1 << 20));
        if (ctx != null) {
            ctx.addTaskCompletionListener(new TaskCompletionListener() {
                @Override
                public void onTaskCompletion(TaskContext context) {
                    abandon();
                }
            });
        }
    }

    /** The task's input has ended: the file becomes visible to the reader (nothing if no group was written). */
    void finish() {
        if (out == null || finished) {
            return;
        }
        try {
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
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
