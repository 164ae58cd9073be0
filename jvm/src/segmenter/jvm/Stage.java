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
import org.apache.spark.util.LongAccumulator;

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
 * per-row rules hold; its pieces go to the stage file as they come (through the writer's buffer, no
 * copy held by the task), its metas are kept, and {@link Fold} applies the clean test's cross-row
 * rules row by row. When the run cannot be clean any more (or outgrows {@code cap}), its rows are
 * passed through, rebuilt from the bytes written and the metas, and the file's end moves back to the
 * run's start; the key's following rows pass through as they come. When the key changes, a clean run
 * is staged: its rows' sort keys and lengths follow its bytes.
 *
 * <p>Where staging cannot win, a task does not walk: when no message has been staged once it has seen
 * {@code probe} rows or {@code probeBytes} bytes of pieces (a run still open then decides first), every
 * later row is passed straight through,
 * untouched, as the plan without staging sends it (a scattered table: no message is complete among a
 * task's consecutive rows). Passing a row through is always right (the pass after the shuffle judges
 * it with its key's other rows), so the choice changes no output row; each task adds one to the
 * accumulator of its choice when its input ends ({@code staged}: it walked all its rows;
 * {@code passed}: it stopped after its first ones).
 *
 * <p>Stage file: one per task attempt, {@code <partition>-<attempt>-<taskAttemptId>.stage} in the stage
 * folder (a directory every executor sees, inside the output's {@code _side}), records back to back:
 * per message its pieces in order, then {@code i32 n}, per row {@code i32 skLength, sk, i32 plen}, then
 * {@code i64 blobLength, i32 headLength} (the bytes from {@code n} to here, so the file can be read
 * from its end). The file is closed when the task's input ends, before its shuffle output is
 * committed, so every reference a reducer reads names bytes on disk; an attempt that fails deletes its
 * file, and a task that staged nothing leaves none. Reference: {@code i64 position, i32 tailLength
 * (head and trailer), i64 blobLength, i32 n, name (UTF-8)}: a reducer reads the whole record in one
 * read.
 */
final class Stage implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
    private static final long serialVersionUID = 2L;
    private static final int WRITE_BUFFER = 1 << 20;
    private static final int TRAILER = 12; // i64 blobLength, i32 headLength
    private static final int MAX_RUN_ROWS = 1 << 20; // more rows than this in one run: passed through

    private final StructType meta;
    private final long maxMessageSize;
    private final long cap;
    private final long probe; // rows
    private final long probeBytes;
    private final String dir;
    private final LongAccumulator staged; // tasks that walked all their rows, or null
    private final LongAccumulator passed; // tasks that passed their rows through after the probe, or null

    private Stage(StructType meta, long maxMessageSize, long cap, long probe, long probeBytes, String dir,
        LongAccumulator staged, LongAccumulator passed) {
        this.meta = meta;
        this.maxMessageSize = maxMessageSize;
        this.cap = cap;
        this.probe = probe;
        this.probeBytes = probeBytes;
        this.dir = dir;
        this.staged = staged;
        this.passed = passed;
    }

    /** {@code selected} (the class doc's input) with its clean runs staged in {@code dir}: lazy, like any DataFrame. */
    static Dataset<Row> run(Dataset<Row> selected, String dir, long maxMessageSize, long cap, long probe,
        long probeBytes, LongAccumulator staged, LongAccumulator passed) {
        StructType schema = selected.schema();
        StructType meta = (StructType) schema.apply("m").dataType();
        Stage stage = new Stage(meta, maxMessageSize, cap, probe, probeBytes, dir, staged, passed);
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
        private final JoinedRow through = new JoinedRow(); // a row passed through (read before the next one)
        private final Iterator<InternalRow> input;
        private final ArrayDeque<InternalRow> out = new ArrayDeque<>();
        private final Fold fold = new Fold(meta, maxMessageSize);
        private final int sk = meta.fieldIndex("sk"), plen = meta.fieldIndex("plen");
        private final int fields = meta.size();
        private BinaryView run; // the current run's key, or null
        private BinaryView passing; // the key whose rows pass through (its run could not be clean), or null
        private Writer writer; // opened at the first run
        private long runStart; // where the current run's bytes start in the stage file
        private InternalRow pendingRow; // the row that took the run past the cap (its piece is not written)
        private long seen; // input rows walked
        private long seenBytes; // and their pieces' bytes
        private long stagedMessages;
        private boolean walking = true; // false: every further row passes straight through
        private boolean ended;

        Runs(Iterator<InternalRow> input) {
            this.input = input;
        }

        @Override
        public boolean hasNext() {
            while (out.isEmpty() && !ended) {
                if (!input.hasNext()) {
                    close();
                    end();
                } else if (!walking) {
                    return true; // next() passes the input's next row through
                } else {
                    step(input.next());
                }
            }
            return !out.isEmpty();
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) {
                throw new NoSuchElementException();
            }
            InternalRow row = out.poll();
            return row != null ? row : through.apply(input.next(), noRef);
        }

        /** The input has ended: the stage file complete, the task's choice counted. */
        private void end() {
            ended = true;
            if (writer != null) {
                writer.finish();
            }
            LongAccumulator chosen = walking ? staged : passed;
            if (chosen != null) {
                chosen.add(1L);
            }
        }

        private void step(InternalRow row) {
            seen++;
            seenBytes += row.isNullAt(3) ? 0 : row.getBinaryView(3).numBytes();
            boolean main = row.getBoolean(0) && !row.isNullAt(1) && row.isNullAt(2);
            BinaryView key = main ? row.getBinaryView(1) : null;
            if (run != null && main && run.equals(key)) {
                extend(row);
                return;
            }
            close();
            if (stagedMessages == 0 && (seen > probe || seenBytes > probeBytes)) { // nothing confined in the first rows: stop walking
                walking = false;
                passing = null;
                out.add(new JoinedRow(row, noRef));
                return;
            }
            if (passing != null && !(main && passing.equals(key))) {
                passing = null;
            }
            InternalRow m = main ? row.getStruct(5, fields) : null;
            boolean rowOk = main && !row.isNullAt(4) && row.getBoolean(4);
            if (main && passing == null && fold.opens(m, rowOk)) {
                run = key.copy();
                if (writer == null) {
                    writer = new Writer(dir);
                }
                runStart = writer.position();
                fold.start(true);
                extend(row);
                return;
            }
            out.add(new JoinedRow(row, noRef)); // read by the consumer before the next input row
        }

        /** The row joins the run; a run that cannot be clean any more (or outgrows the cap) is released. */
        private void extend(InternalRow row) {
            add(row);
            if (!fold.possible() || fold.size() > cap || fold.metas().size() > MAX_RUN_ROWS) {
                release();
                passing = run;
                run = null;
            }
        }

        /** The row's piece into the stage file and its meta (a copy) into the fold. */
        private void add(InternalRow row) {
            InternalRow m = row.getStruct(5, fields).copy();
            boolean rowOk = !row.isNullAt(4) && row.getBoolean(4);
            BinaryView piece = row.isNullAt(3) ? null : row.getBinaryView(3);
            int length = piece == null ? 0 : piece.numBytes();
            fold.add(m, rowOk, length);
            if (length > 0 && fold.size() <= cap) {
                writer.put(piece);
            } else if (length > 0) { // past the cap: the run is released with this row passed as it came
                pendingRow = row;
            }
        }

        /** The current run's rows passed through, rebuilt from the bytes written and the metas; they are unwritten. */
        private void release() {
            List<InternalRow> metas = fold.metas();
            long at = runStart;
            int rows = pendingRow == null ? metas.size() : metas.size() - 1;
            byte[] pk = run.getBytes();
            for (int i = 0; i < rows; i++) {
                InternalRow m = metas.get(i);
                int length = m.getInt(plen);
                byte[] piece = writer.readBack(at, length);
                at += length;
                out.add(new GenericInternalRow(new Object[] {true, pk, null, piece, true, m, null}));
            }
            writer.rewind(runStart);
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
                byte[] ref = writer.seal(runStart, fold.metas(), sk, plen);
                out.add(new GenericInternalRow(new Object[] {true, run.getBytes(), null, null, true, fold.last(), ref}));
                stagedMessages++;
            } else {
                release();
            }
            run = null;
        }
    }

    /**
     * A task attempt's stage file, written through one direct buffer: a piece is copied once, from the
     * row's memory into the buffer, and the buffer goes to the file without another copy.
     */
    private static final class Writer {
        private final Path path;
        private final String name;
        private final FileChannel channel;
        private final ByteBuffer buffer = Platform.allocateDirectBuffer(WRITE_BUFFER);
        private final long address = Platform.getDirectBufferAddress(buffer);
        private long flushed; // where the buffer's first byte goes in the file
        private boolean finished;

        Writer(String dir) {
            name = TaskFiles.attemptName() + ".stage";
            try {
                Files.createDirectories(Paths.get(dir));
                path = Paths.get(dir).resolve(name);
                channel = FileChannel.open(path, StandardOpenOption.CREATE, StandardOpenOption.TRUNCATE_EXISTING,
                    StandardOpenOption.READ, StandardOpenOption.WRITE);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            TaskFiles.onCompletion(this::abandon);
        }

        /** The file's end: where the next byte goes. */
        long position() {
            return flushed + buffer.position();
        }

        /** {@code length} bytes from {@code base}/{@code offset} (Spark's memory addressing). */
        private void put(Object base, long offset, long length) {
            long done = 0;
            while (done < length) {
                if (!buffer.hasRemaining()) {
                    flush();
                }
                int n = (int) Math.min(length - done, buffer.remaining());
                Platform.copyMemory(base, offset + done, null, address + buffer.position(), n);
                buffer.position(buffer.position() + n);
                done += n;
            }
        }

        void put(BinaryView bytes) {
            put(bytes.getBaseObject(), bytes.getBaseOffset(), bytes.numBytes());
        }

        private void room(int bytes) {
            if (buffer.remaining() < bytes) {
                flush();
            }
        }

        /**
         * The message whose pieces were written since {@code start} is complete: its rows' sort keys and
         * lengths after them, then the trailer; its reference.
         */
        byte[] seal(long start, List<InternalRow> metas, int sk, int plen) {
            long blobLength = position() - start;
            long headAt = position();
            room(4);
            buffer.putInt(metas.size());
            for (InternalRow m : metas) {
                BinaryView key = m.getBinaryView(sk);
                room(4);
                buffer.putInt(key.numBytes());
                put(key);
                room(4);
                buffer.putInt(m.getInt(plen));
            }
            long headLength = position() - headAt;
            room(TRAILER);
            buffer.putLong(blobLength).putInt((int) headLength);
            byte[] file = name.getBytes(StandardCharsets.UTF_8);
            return ByteBuffer.allocate(24 + file.length).putLong(start).putInt((int) headLength + TRAILER)
                .putLong(blobLength).putInt(metas.size()).put(file).array();
        }

        /** {@code length} bytes written at {@code at} (in the file or still in the buffer), as a new array. */
        byte[] readBack(long at, int length) {
            byte[] out = new byte[length];
            int done = 0;
            try {
                if (at < flushed) {
                    done = (int) Math.min(length, flushed - at);
                    Reader.readFully(channel, ByteBuffer.wrap(out, 0, done), at);
                }
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            if (done < length) {
                Platform.copyMemory(null, address + (at + done - flushed), out, Platform.BYTE_ARRAY_OFFSET + done,
                    length - done);
            }
            return out;
        }

        /** The file ends at {@code at} again (a released run's bytes are overwritten by the next). */
        void rewind(long at) {
            if (at >= flushed) {
                buffer.position((int) (at - flushed));
            } else {
                buffer.clear();
                flushed = at;
            }
        }

        private void flush() {
            buffer.flip();
            long at = flushed;
            try {
                while (buffer.hasRemaining()) {
                    at += channel.write(buffer, at);
                }
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            flushed = at;
            buffer.clear();
        }

        /** The task's input has ended: the file is complete before the shuffle output that references it. */
        void finish() {
            flush();
            try {
                if (channel.size() > flushed) { // a released run's bytes past the last message
                    channel.truncate(flushed);
                }
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            end(flushed == 0);
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

    /**
     * One staged message as a reducer has read it back: its bytes in the reader's sink, its rows' sort
     * keys and lengths in the reader's head buffer, valid until the reader's next read; decoded into
     * rows only when the message meets other rows ({@link #rows}): a message alone needs none.
     */
    static final class Staged {
        final int n;
        final long blobLength;
        private final ByteBuffer head;

        Staged(int n, long blobLength, ByteBuffer head) {
            this.n = n;
            this.blobLength = blobLength;
            this.head = head;
        }

        /** Each row's sort key and piece length, in order. */
        void rows(RowVisitor visit) {
            ByteBuffer h = head.duplicate();
            h.position(4);
            for (int i = 0; i < n; i++) {
                byte[] key = new byte[h.getInt()];
                h.get(key);
                visit.row(key, h.getInt());
            }
        }
    }

    /** What {@link Staged#rows} hands each row to. */
    interface RowVisitor {
        void row(byte[] sortKey, int pieceLength);
    }

    /** The stage files a reducer task reads references from (each opened once per task). */
    static final class Reader {
        private final Path dir;
        private final Map<String, FileChannel> open = new HashMap<>();
        private ByteBuffer head = ByteBuffer.allocate(1 << 12); // the last message's head and trailer

        Reader(String dir) {
            this.dir = Paths.get(dir);
            TaskFiles.onCompletion(this::close);
        }

        /**
         * The message {@code ref} names: its bytes into the window {@code into} reserves, its head into
         * this reader's buffer, in one scattering read of the whole record.
         */
        Staged read(byte[] ref, Sink into) {
            ByteBuffer r = ByteBuffer.wrap(ref);
            long position = r.getLong();
            int tailLength = r.getInt();
            long blobLength = r.getLong();
            int n = r.getInt();
            String name = new String(ref, r.position(), ref.length - r.position(), StandardCharsets.UTF_8);
            try {
                FileChannel channel = open.get(name);
                if (channel == null) {
                    channel = FileChannel.open(dir.resolve(name), StandardOpenOption.READ);
                    open.put(name, channel);
                }
                if (head.capacity() < tailLength) {
                    head = ByteBuffer.allocate(Math.max(tailLength, 2 * head.capacity()));
                }
                head.clear().limit(tailLength);
                ByteBuffer[] both = {into.reserve(blobLength), head};
                channel.position(position);
                long want = blobLength + tailLength;
                for (long got = 0; got < want;) {
                    long read = channel.read(both);
                    if (read < 0) {
                        throw new IOException("stage file ends before the message referenced at " + position);
                    }
                    got += read;
                }
                head.flip();
                int headLength = tailLength - TRAILER;
                if (head.getInt(0) != n || head.getLong(headLength) != blobLength || head.getInt(headLength + 8) != headLength) {
                    throw new IllegalStateException("stage file " + name + " does not hold the message referenced at " + position);
                }
                return new Staged(n, blobLength, head);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }

        static void readFully(FileChannel channel, ByteBuffer target, long position) throws IOException {
            long at = position;
            while (target.hasRemaining()) {
                int got = channel.read(target, at);
                if (got < 0) {
                    throw new IOException("stage file ends before the bytes at " + position);
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
