package segmenter.jvm;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.BinaryView;
import org.apache.spark.util.LongAccumulator;

/**
 * One pass over each message's pieces, pre-sorted by key: what {@code listagg} + {@code collect_list}
 * + the SQL clean test did, in one walk (reassembly/spark/engine/bridge.py, {@code fast_aggregate}).
 *
 * <p>Input rows, sorted by (pk, routable, bk, m.sk, m.plen) within each partition:
 * {@code routable, pk, bk, piece, row_ok, m} where {@code row_ok} holds every per-row rule
 * (generated from the header table in SQL) and {@code m} is the row's meta struct (the fields the
 * Python judge reads). Output: one row per key, {@code routable, pk, bk, blob, n, last, meta, clean},
 * the columns of the SQL aggregate plus its clean verdict; {@code meta} is built only for rows
 * that are not clean (the judge's input: clean rows never need it).
 *
 * <p>The cross-row rules (the only ones here) are {@link Fold}'s: one message from offset 0,
 * contiguous, exactly one LAST at the end, header fields agreeing with the last row's, and the
 * message CRC, folded from the segments' CRCs that {@code row_ok} has verified against their data.
 *
 * <p>After {@link #stage} (the scan staged the messages complete and clean among its own rows): a
 * row with a {@code ref} stands for a staged message; alone under its key it is delivered as a
 * clean message, its bytes read back from the stage file straight into the task's buffer (one read
 * of the whole record; its rows' metadata is never made, a clean row needs none); with any other row
 * it is rebuilt into its rows for the side file ({@link Stage}).
 *
 * <p>Why Catalyst's own rows ({@link InternalRow}), not {@code Dataset.mapPartitions} with a
 * {@code Row} encoder: the encoder turns every sorted row into a {@code Row} (each piece copied
 * into a fresh array, every meta field boxed) and every output {@code Row} back into an
 * {@code UnsafeRow} through type-checking serializer expressions. Here each piece is copied once,
 * straight from the sorter's memory ({@link BinaryView}, no intermediate array), into a buffer
 * reused by the task (grown as its groups need; its size comes from the pieces,
 * never from a declared length). A message that fills the buffer exactly is emitted as the buffer
 * itself, which the next group then overwrites; any other is copied into an array of its exact size.
 * Messages of one size are the common case (a producer cuts every payload the same way), so once
 * two groups in a row had the same size the buffer takes that size: from then on no message is
 * copied a second time and no array is allocated per message. Handing out the buffer is safe for
 * the reason any Spark operator may reuse the row it returns: the only reader of these rows is the
 * scan over this pass ({@code RDDScanExec}, {@link Plans#frame}), which projects each row into an
 * {@code UnsafeRow} of its own before it asks for the next one, and the next group is read only
 * when it asks.
 *
 * <p>{@link #split}: the same pass emitting only the clean rows and writing every other group to a
 * {@link SideFile}, for a second, Python-only job: then the plan that writes the clean messages has
 * no Python operator (reassembly/spark/batch/save.py).
 *
 * <p>Lineage: when the meta struct has a field {@code src} (the input columns kept), a clean row
 * also carries {@code sources}, the {@code src} of each of its rows in sort (offset) order, and a
 * side file carries each row's {@code src} beside it.
 */
public final class Reassemble implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
    private static final long serialVersionUID = 1L;
    private static final int MAX_ARRAY = Integer.MAX_VALUE - 16; // a JVM byte[] (Spark's cap on a value)
    private static final int KEEP = 64 << 20; // the largest buffer kept from one group to the next

    private final long maxMessageSize;
    private final boolean emitClean, emitDirty;
    private final StructType meta;
    private final int metaFields;
    private final String sideDir; // null: no side file
    private final String stageDir; // where the scan staged messages (Stage.java), or null
    private final int ref; // the input column of a staged message's reference; negative: none
    private final int skHeader, sk, far, isNull, plen;
    private final int src; // the meta field of the kept columns; negative: nothing kept
    private final StructType srcType;

    private Reassemble(StructType meta, long maxMessageSize, boolean emitClean, boolean emitDirty, String sideDir,
        int skHeader, String stageDir, int ref) {
        this.meta = meta;
        this.maxMessageSize = maxMessageSize;
        this.stageDir = stageDir;
        this.ref = ref;
        this.emitClean = emitClean;
        this.emitDirty = emitDirty;
        this.sideDir = sideDir;
        this.skHeader = skHeader;
        sk = meta.fieldIndex("sk");
        far = meta.fieldIndex("far");
        isNull = meta.fieldIndex("is_null");
        plen = meta.fieldIndex("plen");
        metaFields = meta.size();
        src = sourceField(meta);
        srcType = src < 0 ? null : (StructType) meta.fields()[src].dataType();
    }

    private static int sourceField(StructType meta) {
        return Arrays.asList(meta.fieldNames()).indexOf("src");
    }

    /** The output schema for input whose meta struct is {@code meta} ({@code sources} last when it has {@code src}). */
    public static StructType outputSchema(StructType meta) {
        int src = sourceField(meta);
        StructType out = baseSchema(meta);
        return src < 0 ? out : out.add("sources", new ArrayType(meta.fields()[src].dataType(), true), true);
    }

    private static StructType baseSchema(StructType meta) {
        return new StructType(new StructField[] {
            DataTypes.createStructField("routable", DataTypes.BooleanType, false),
            DataTypes.createStructField("pk", DataTypes.BinaryType, true),
            DataTypes.createStructField("bk", DataTypes.BinaryType, true),
            DataTypes.createStructField("blob", DataTypes.BinaryType, false),
            DataTypes.createStructField("n", DataTypes.IntegerType, false),
            DataTypes.createStructField("last", meta, false),
            DataTypes.createStructField("meta", new ArrayType(meta, false), true),
            DataTypes.createStructField("clean", DataTypes.BooleanType, false),
        });
    }

    /**
     * {@code sorted} (see the class doc) to one row per key: the clean ones, the others, or both.
     *
     * <p>Lazy, like any DataFrame: the sorted plan becomes an RDD of its internal rows, planned in a
     * clone of the session with adaptive execution off, because an adaptive plan runs its shuffle the
     * moment its RDD is asked for; {@code sorted} shuffles to a partition count it names itself, so
     * adaptive execution had nothing to coalesce there. The pass's output is a DataFrame over that
     * RDD ({@code LogicalRDD}): the rest of the query plans as usual.
     */
    public static Dataset<Row> run(Dataset<Row> sorted, long maxMessageSize, boolean emitClean, boolean emitDirty) {
        return pass(sorted, maxMessageSize, emitClean, emitDirty, null, 0, null);
    }

    /**
     * The clean rows of {@code sorted}; every other group goes to a {@link SideFile} in {@code sideDir}
     * (a directory every executor sees) as the query runs. {@code skHeader}: where the header starts
     * in a routable row's {@code sk}.
     */
    public static Dataset<Row> split(Dataset<Row> sorted, long maxMessageSize, String sideDir, int skHeader) {
        return pass(sorted, maxMessageSize, true, false, sideDir, skHeader, null);
    }

    /**
     * {@link #split} over rows that went through {@link #stage} first (the column {@code ref}), reading
     * the staged messages back from {@code stageDir}.
     */
    public static Dataset<Row> split(Dataset<Row> sorted, long maxMessageSize, String sideDir, int skHeader,
        String stageDir) {
        return pass(sorted, maxMessageSize, true, false, sideDir, skHeader, stageDir);
    }

    /**
     * The scan's side of the staged plan ({@link Stage}): {@code selected} (this pass's input columns,
     * before the shuffle) with the messages complete and clean among a task's consecutive rows staged in
     * {@code stageDir}, each replaced by one reference row (column {@code ref}). Runs of more than
     * {@code cap} bytes are not staged; a task that has staged nothing in its first {@code probe} rows
     * (or {@code probeBytes} bytes) passes the rest straight through; each task adds one to {@code staged} or {@code passed} (either
     * may be null) as it chose.
     */
    public static Dataset<Row> stage(Dataset<Row> selected, String stageDir, long maxMessageSize, long cap, long probe,
        long probeBytes, LongAccumulator staged, LongAccumulator passed) {
        return Stage.run(selected, stageDir, maxMessageSize, cap, probe, probeBytes, staged, passed);
    }

    private static Dataset<Row> pass(Dataset<Row> sorted, long maxMessageSize, boolean emitClean, boolean emitDirty,
        String sideDir, int skHeader, String stageDir) {
        StructType meta = (StructType) sorted.schema().apply("m").dataType();
        int ref = Arrays.asList(sorted.schema().fieldNames()).indexOf("ref");
        if (ref >= 0 && (stageDir == null || sideDir == null || emitDirty || sourceField(meta) >= 0)) {
            throw new IllegalArgumentException("staged rows are read back only by split() with its stage folder,"
                + " without kept columns");
        }
        Reassemble pass = new Reassemble(meta, maxMessageSize, emitClean, emitDirty, sideDir, skHeader, stageDir, ref);
        return Plans.frame(sorted, Plans.rows(sorted).toJavaRDD().mapPartitions(pass).rdd(), outputSchema(meta));
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> input) {
        SideFile side = sideDir == null ? null : new SideFile(sideDir, skHeader, sk, far, isNull, plen, src, srcType);
        return new Groups(input, side, stageDir == null ? null : new Stage.Reader(stageDir));
    }

    /** A binary column of a row the sorter may overwrite: a view while the row lasts, else a copy. */
    private static BinaryView view(InternalRow row, int i) {
        return row.isNullAt(i) ? null : row.getBinaryView(i);
    }

    private static boolean same(BinaryView a, BinaryView b) {
        return a == null ? b == null : a.equals(b);
    }

    /** Groups consecutive rows of one key; yields the groups of the kinds asked for. */
    private final class Groups implements Iterator<InternalRow> {
        private final Iterator<InternalRow> input;
        private InternalRow ahead; // the first row of the next group (valid until input.next())
        private InternalRow ready; // the next output row
        private byte[] buffer; // the pieces of the current group: reused, or handed out as its blob
        private int next = 1 << 16; // the length of a new buffer, when the group starts without one
        private long lastSize = -1; // the previous group's size
        private final SideFile side; // where groups that are not clean go, or null
        private final Stage.Reader reader; // the stage files, or null
        private final Fold fold = new Fold(meta, maxMessageSize);
        private long size; // the current group's bytes in the buffer

        Groups(Iterator<InternalRow> input, SideFile side, Stage.Reader reader) {
            this.input = input;
            this.side = side;
            this.reader = reader;
            this.ahead = input.hasNext() ? input.next() : null;
        }

        @Override
        public boolean hasNext() {
            while (ready == null && ahead != null) {
                ready = group();
            }
            if (ready == null && side != null) {
                side.finish();
            }
            return ready != null;
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) {
                throw new NoSuchElementException();
            }
            InternalRow out = ready;
            ready = null;
            return out;
        }

        /** Appends {@code piece} to the buffer at {@code size}; the new size. */
        private long append(BinaryView piece, long size) {
            long end = grow(size, piece.numBytes());
            piece.writeToMemory(buffer, Platform.BYTE_ARRAY_OFFSET + size);
            return end;
        }

        /** The buffer holding {@code size + length} bytes (its first {@code size} kept); that sum. */
        private long grow(long size, long length) {
            long end = size + length;
            if (end > MAX_ARRAY) {
                throw new IllegalStateException("an aggregate of " + end + " bytes: over Spark's 2 GiB cap on a value");
            }
            if (end > buffer.length) {
                buffer = Arrays.copyOf(buffer, (int) Math.min(MAX_ARRAY, Math.max(end, 2L * buffer.length)));
            }
            return end;
        }

        /** A staged message's bytes go here: the buffer's next {@code length} bytes. */
        private java.nio.ByteBuffer reserve(long length) {
            long at = size;
            size = grow(size, length);
            return java.nio.ByteBuffer.wrap(buffer, (int) at, (int) length);
        }

        /** A staged message's rows, as the side file needs them, into the fold. */
        private void unfold(Stage.Staged message) {
            message.rows((key, length) -> {
                GenericInternalRow m = new GenericInternalRow(metaFields);
                m.update(sk, key);
                m.update(far, false);
                m.update(isNull, false);
                m.update(plen, length);
                fold.add(m, false, 0);
            });
        }

        /** Consumes one group; its output row, or null when its kind is not asked for. */
        private InternalRow group() {
            InternalRow row = ahead;
            if (buffer == null) {
                buffer = new byte[next];
            }
            boolean routable = row.getBoolean(0);
            byte[] pk = row.isNullAt(1) ? null : row.getBinary(1);
            byte[] bk = row.isNullAt(2) ? null : row.getBinary(2);
            BinaryView pkView = pk == null ? null : BinaryView.fromBytes(pk);
            BinaryView bkView = bk == null ? null : BinaryView.fromBytes(bk);
            fold.start(routable && bk == null);
            size = 0;
            int rows = 0, staged = 0;
            InternalRow stagedLast = null;
            Stage.Staged held = null; // a staged message read back, its rows not made yet (alone, it needs none)
            while (true) {
                rows++;
                if (ref >= 0 && !row.isNullAt(ref)) { // a message staged by the scan (Stage.java)
                    staged++;
                    stagedLast = row.getStruct(5, metaFields).copy();
                    held = reader.read(row.getBinary(ref), this::reserve);
                    if (rows > 1) { // it meets the rows before it: judged with them
                        unfold(held);
                        held = null;
                    }
                } else {
                    InternalRow m = row.getStruct(5, metaFields).copy(); // kept past the sorter's next row
                    BinaryView piece = view(row, 3);
                    int length = piece == null ? 0 : piece.numBytes();
                    if (length > 0) {
                        size = append(piece, size);
                    }
                    fold.add(m, !row.isNullAt(4) && row.getBoolean(4), length);
                }
                ahead = input.hasNext() ? input.next() : null;
                if (ahead == null || ahead.getBoolean(0) != routable || !same(pkView, view(ahead, 1))
                    || !same(bkView, view(ahead, 2))) {
                    break;
                }
                if (held != null) { // it meets the rows after it
                    unfold(held);
                    held = null;
                }
                row = ahead;
            }
            List<InternalRow> metas = fold.metas();
            int n = held != null ? held.n : metas.size();
            // A staged message alone under its key is the clean message the scan found; with any other
            // row it is judged with all of them, rebuilt (Stage.java's class doc).
            boolean ok = staged == 0 ? fold.clean() : staged == 1 && rows == 1;
            InternalRow last = staged == 0 ? fold.last() : stagedLast;
            if (!ok && side != null) {
                side.write(routable, bk != null, metas, buffer);
            }
            InternalRow out = null;
            if (ok ? emitClean : emitDirty) {
                // the pieces' own lengths, no declared length; the buffer itself when they fill it (see the class doc)
                byte[] blob = size == buffer.length ? buffer : Arrays.copyOf(buffer, (int) size);
                Object metaArray = ok ? null : new GenericArrayData(metas.toArray());
                if (src < 0) {
                    out = new GenericInternalRow(new Object[] {routable, pk, bk, blob, n, last, metaArray, ok});
                } else { // a clean row's kept columns, row by row; the judge reads them from meta
                    Object sources = ok ? new GenericArrayData(metas.stream().map(m -> m.get(src, srcType)).toArray())
                        : null;
                    out = new GenericInternalRow(
                        new Object[] {routable, pk, bk, blob, metas.size(), last, metaArray, ok, sources});
                }
            }
            if (buffer != null && buffer.length > KEEP) { // a large message's buffer is not held for the task
                buffer = null;
                next = 1 << 16;
            } else if (buffer != null && size == lastSize && size != buffer.length) { // two of one size
                buffer = null;
                next = (int) size;
            }
            lastSize = size;
            return out;
        }
    }
}
