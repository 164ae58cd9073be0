package segmenter.jvm;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.BinaryView;

/**
 * The scan's side of the staged plan (reassembly/spark/engine/bridge.py, {@code fast_aggregate} with a stage
 * folder): each scan task assembles the messages that are complete and clean among its own consecutive
 * rows, writes their bytes to a stage file of its own, and sends across the shuffle one small
 * <em>reference</em> row per staged message instead of its rows; every other row crosses the shuffle as
 * it came.
 *
 * <p>Why staging cannot decide alone: the arbitration rule is one rule over the whole multiset of a
 * message's rows, and another task may hold a duplicate, a conflicting copy, a forged sibling, a far
 * row's stub or a whole second copy of the same GroupId. The reference carries the message's key like
 * any row, so after the shuffle {@link Reassemble} sees every row of the key together: a key whose only
 * row is one reference is the clean message staged (read back from its stage file and delivered as the
 * one pass delivers a clean message); a key with a reference and anything else is judged with all its
 * rows, the staged ones rebuilt from the stage file ({@link Reader}), exactly as if none had been
 * staged. So the output is the same, row for row, whatever the layout (tests/spark/test_split_layouts.py).
 *
 * <p>Input rows: {@code routable, pk, bk, piece, row_ok, m} in scan order (the one pass's columns before
 * its sort); output: the same plus {@code ref} (binary, NULL on a row passed through). A run is the
 * consecutive rows of one main key ({@code routable}, {@code bk} NULL) from a row at offset 0 whose
 * per-row rules hold; its pieces go into a buffer the task reuses, its metas are kept, and
 * {@link Fold} applies the clean test's cross-row rules row by row. When the run cannot be clean any
 * more (or outgrows {@code cap}), its rows are passed through, rebuilt from the buffer and the metas,
 * and the key's following rows pass through as they come; when the key changes, a clean run is staged.
 * Memory per task: the buffer, at most {@code cap} plus one piece.
 *
 * <p>Stage file: one per task attempt, {@code <partition>-<attempt>-<taskAttemptId>.stage} in the stage
 * folder (a directory every executor sees, inside the output's {@code _side}), records back to back:
 * per message {@code i32 n}, then per row {@code i32 skLength, sk, i32 plen}, then the pieces in
 * order. The file is closed when the task's input ends, before its shuffle output is committed, so
 * every reference a reducer reads names bytes on disk; an attempt that fails deletes its file.
 * Reference: {@code i64 position, i32 headLength, i64 blobLength, i32 n, name (UTF-8)}.
 */
final class Stage implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
    private static final long serialVersionUID = 1L;
    private static final int WRITE_BUFFER = 1 << 20;

    private final StructType meta;
    private final long maxMessageSize;
    private final long cap;
    private final String dir;

    private Stage(StructType meta, long maxMessageSize, long cap, String dir) {
        this.meta = meta;
        this.maxMessageSize = maxMessageSize;
        this.cap = cap;
        this.dir = dir;
    }

    /** {@code selected} (the class doc's input) with its clean runs staged in {@code dir}: lazy, like any DataFrame. */
    static Dataset<Row> run(Dataset<Row> selected, String dir, long maxMessageSize, long cap) {
        StructType schema = selected.schema();
        StructType meta = (StructType) schema.apply("m").dataType();
        Stage stage = new Stage(meta, maxMessageSize, cap, dir);
        StructType out = schema.add("ref", DataTypes.BinaryType, true);
        return Plans.frame(selected, Plans.rows(selected).toJavaRDD().mapPartitions(stage).rdd(), out);
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> input) {
        return new Runs(input);
    }

    /** The task's rows, runs staged. */
    private final class Runs implements Iterator<InternalRow> {
        private final GenericInternalRow noRef = new GenericInternalRow(new Object[] {null});
        private final Iterator<InternalRow> input;
        private final ArrayDeque<InternalRow> out = new ArrayDeque<>();
        private final Fold fold = new Fold(meta, maxMessageSize);
        private final int sk = meta.fieldIndex("sk"), plen = meta.fieldIndex("plen");
        private final int fields = meta.size();
        private byte[] buffer = new byte[1 << 16];
        private BinaryView run; // the current run's key, or null
        private BinaryView passing; // the key whose rows pass through (its run could not be clean), or null
        private Writer writer; // opened at the first staged message
        private InternalRow pendingRow; // the row that took the run past the cap (its piece is not in the buffer)
        private boolean ended;

        Runs(Iterator<InternalRow> input) {
            this.input = input;
        }

        @Override
        public boolean hasNext() {
            while (out.isEmpty() && !ended) {
                if (input.hasNext()) {
                    step(input.next());
                } else {
                    close();
                    ended = true;
                    if (writer != null) {
                        writer.finish();
                    }
                }
            }
            return !out.isEmpty();
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) {
                throw new NoSuchElementException();
            }
            return out.poll();
        }

        private void step(InternalRow row) {
            boolean main = row.getBoolean(0) && !row.isNullAt(1) && row.isNullAt(2);
            BinaryView key = main ? row.getBinaryView(1) : null;
            if (run != null && main && run.equals(key)) {
                extend(row);
                return;
            }
            close();
            if (passing != null && !(main && passing.equals(key))) {
                passing = null;
            }
            InternalRow m = main ? row.getStruct(5, fields) : null;
            boolean rowOk = main && !row.isNullAt(4) && row.getBoolean(4);
            if (main && passing == null && fold.opens(m, rowOk)) {
                run = key.copy();
                fold.start(true);
                extend(row);
                return;
            }
            out.add(new JoinedRow(row, noRef)); // read by the consumer before the next input row
        }

        /** The row joins the run; a run that cannot be clean any more (or outgrows the cap) is released. */
        private void extend(InternalRow row) {
            add(row);
            if (!fold.possible() || fold.size() > cap) {
                release();
                passing = run;
                run = null;
            }
        }

        /** The row's piece into the buffer and its meta (a copy) into the fold. */
        private void add(InternalRow row) {
            InternalRow m = row.getStruct(5, fields).copy();
            boolean rowOk = !row.isNullAt(4) && row.getBoolean(4);
            BinaryView piece = row.isNullAt(3) ? null : row.getBinaryView(3);
            int length = piece == null ? 0 : piece.numBytes();
            long at = fold.size();
            fold.add(m, rowOk, length);
            if (length > 0 && fold.size() <= cap) {
                if (fold.size() > buffer.length) {
                    buffer = java.util.Arrays.copyOf(buffer, (int) Math.min(cap, Math.max(fold.size(), 2L * buffer.length)));
                }
                piece.writeToMemory(buffer, Platform.BYTE_ARRAY_OFFSET + at);
            } else if (length > 0) { // past the cap: the run is released with this row passed as it came
                pendingRow = row;
            }
        }

        /** The current run's rows passed through, rebuilt from the buffer and the metas. */
        private void release() {
            List<InternalRow> metas = fold.metas();
            int pos = 0;
            int rows = pendingRow == null ? metas.size() : metas.size() - 1;
            byte[] pk = run.getBytes();
            for (int i = 0; i < rows; i++) {
                InternalRow m = metas.get(i);
                int length = m.getInt(plen);
                byte[] piece = java.util.Arrays.copyOfRange(buffer, pos, pos + length);
                pos += length;
                out.add(new GenericInternalRow(new Object[] {true, pk, null, piece, true, m, null}));
            }
            if (pendingRow != null) {
                out.add(new JoinedRow(pendingRow, noRef));
                pendingRow = null;
            }
        }

        /** The current run ends: staged (one reference row) when clean, else its rows passed through. */
        private void close() {
            if (run == null) {
                return;
            }
            if (fold.clean()) {
                if (writer == null) {
                    writer = new Writer(dir);
                }
                List<InternalRow> metas = fold.metas();
                byte[] ref = writer.write(metas, sk, plen, buffer, (int) fold.size());
                out.add(new GenericInternalRow(new Object[] {true, run.getBytes(), null, null, true, fold.last(), ref}));
            } else {
                release();
            }
            run = null;
        }
    }

    /** A task attempt's stage file. */
    private static final class Writer {
        private final Path path;
        private final String name;
        private final FileChannel channel;
        private final byte[] head = new byte[WRITE_BUFFER];
        private long position;
        private boolean finished;

        Writer(String dir) {
            name = TaskFiles.attemptName() + ".stage";
            try {
                Files.createDirectories(Paths.get(dir));
                path = Paths.get(dir).resolve(name);
                channel = FileChannel.open(path, StandardOpenOption.CREATE, StandardOpenOption.TRUNCATE_EXISTING,
                    StandardOpenOption.WRITE);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            TaskFiles.onCompletion(this::abandon);
        }

        /** One message: its rows' sort keys and lengths, then its bytes; its reference. */
        byte[] write(List<InternalRow> metas, int sk, int plen, byte[] blob, int blobLength) {
            ByteBuffer h = ByteBuffer.wrap(head);
            h.putInt(metas.size());
            for (InternalRow m : metas) {
                byte[] key = m.getBinary(sk);
                if (h.remaining() < key.length + 8) {
                    throw new IllegalStateException("a staged message's headers outgrow " + WRITE_BUFFER + " bytes");
                }
                h.putInt(key.length).put(key).putInt(m.getInt(plen));
            }
            int headLength = h.position();
            long at = position;
            try {
                h.flip();
                while (h.hasRemaining()) {
                    channel.write(h);
                }
                ByteBuffer b = ByteBuffer.wrap(blob, 0, blobLength);
                while (b.hasRemaining()) {
                    channel.write(b);
                }
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            position += headLength + (long) blobLength;
            byte[] file = name.getBytes(StandardCharsets.UTF_8);
            return ByteBuffer.allocate(24 + file.length).putLong(at).putInt(headLength).putLong(blobLength)
                .putInt(metas.size()).put(file).array();
        }

        /** The task's input has ended: the file is complete before the shuffle output that references it. */
        void finish() {
            end(false);
        }

        /** After the task: an attempt that did not reach the end of its input leaves nothing. */
        private void abandon() {
            end(true);
        }

        private void end(boolean discard) {
            if (finished) {
                return;
            }
            finished = true;
            try {
                channel.close();
                if (discard) {
                    Files.deleteIfExists(path);
                }
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    /** One staged message as a reducer reads it back: its rows' sort keys and lengths, its bytes. */
    static final class Staged {
        final byte[][] keys;
        final int[] lengths;
        final long blobLength;

        Staged(byte[][] keys, int[] lengths, long blobLength) {
            this.keys = keys;
            this.lengths = lengths;
            this.blobLength = blobLength;
        }
    }

    /** The stage files a reducer task reads references from (each opened once per task). */
    static final class Reader {
        private final Path dir;
        private final Map<String, FileChannel> open = new HashMap<>();

        Reader(String dir) {
            this.dir = Paths.get(dir);
            TaskFiles.onCompletion(this::close);
        }

        /** The message {@code ref} names, its bytes appended to {@code into} at {@code at} (which must have room). */
        Staged read(byte[] ref, Sink into) {
            ByteBuffer r = ByteBuffer.wrap(ref);
            long position = r.getLong();
            int headLength = r.getInt();
            long blobLength = r.getLong();
            int n = r.getInt();
            String name = new String(ref, r.position(), ref.length - r.position(), StandardCharsets.UTF_8);
            try {
                FileChannel channel = open.get(name);
                if (channel == null) {
                    channel = FileChannel.open(dir.resolve(name), StandardOpenOption.READ);
                    open.put(name, channel);
                }
                ByteBuffer head = ByteBuffer.allocate(headLength);
                readFully(channel, head, position);
                head.flip();
                if (head.getInt() != n) {
                    throw new IllegalStateException("stage file " + name + " does not hold the message referenced at " + position);
                }
                byte[][] keys = new byte[n][];
                int[] lengths = new int[n];
                for (int i = 0; i < n; i++) {
                    keys[i] = new byte[head.getInt()];
                    head.get(keys[i]);
                    lengths[i] = head.getInt();
                }
                ByteBuffer target = into.reserve(blobLength);
                readFully(channel, target, position + headLength);
                return new Staged(keys, lengths, blobLength);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }

        private static void readFully(FileChannel channel, ByteBuffer target, long position) throws IOException {
            long at = position;
            while (target.hasRemaining()) {
                int got = channel.read(target, at);
                if (got < 0) {
                    throw new IOException("stage file ends before the message referenced at " + position);
                }
                at += got;
            }
        }

        private void close() {
            for (FileChannel channel : open.values()) {
                try {
                    channel.close();
                } catch (IOException e) {
                    // closing a file read from: nothing was written, nothing to lose
                }
            }
            open.clear();
        }
    }

    /** Where a reader puts a staged message's bytes: a window of {@code length} bytes at its end. */
    interface Sink {
        ByteBuffer reserve(long length);
    }
}
