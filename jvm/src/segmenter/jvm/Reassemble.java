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

/**
 * One pass over each message's pieces, pre-sorted by key: what {@code listagg} + {@code collect_list}
 * + the SQL clean test did, in one walk (reassembly/spark/jvm.py, {@code fast_aggregate}).
 *
 * <p>Input rows, sorted by (pk, routable, bk, m.sk, m.plen) within each partition:
 * {@code routable, pk, bk, piece, row_ok, m} where {@code row_ok} holds every per-row rule
 * (generated from the header table in SQL) and {@code m} is the row's meta struct (the fields the
 * Python judge reads). Output: one row per key, {@code routable, pk, bk, blob, n, last, meta, clean},
 * the columns of the SQL aggregate plus its clean verdict; {@code meta} is built only for rows
 * that are not clean (the judge's input: clean rows never need it).
 *
 * <p>The cross-row rules (the only ones here): one message from offset 0, contiguous, exactly one
 * LAST at the end, header fields agreeing with the last row's, and the message CRC, folded from
 * the segments' CRCs that {@code row_ok} has verified against their data ({@link Crc32Combine}),
 * so no byte is read twice.
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
 * no Python operator (reassembly/spark/save.py).
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
    private final int metaFields;
    private final int offset, dataLength, isLast, storedLength, originalLength, messageChecksum;
    private final int lengthDeferred, dataChecksum;
    private final DataType[] metaTypes;
    private final String sideDir; // null: no side file
    private final int skHeader, sk, far, isNull, plen;
    private final int src; // the meta field of the kept columns; negative: nothing kept
    private final StructType srcType;

    private Reassemble(StructType meta, long maxMessageSize, boolean emitClean, boolean emitDirty, String sideDir,
        int skHeader) {
        this.maxMessageSize = maxMessageSize;
        this.emitClean = emitClean;
        this.emitDirty = emitDirty;
        this.sideDir = sideDir;
        this.skHeader = skHeader;
        sk = meta.fieldIndex("sk");
        far = meta.fieldIndex("far");
        isNull = meta.fieldIndex("is_null");
        plen = meta.fieldIndex("plen");
        metaFields = meta.size();
        metaTypes = Arrays.stream(meta.fields()).map(StructField::dataType).toArray(DataType[]::new);
        offset = meta.fieldIndex("offset");
        dataLength = meta.fieldIndex("data_length");
        isLast = meta.fieldIndex("is_last");
        storedLength = meta.fieldIndex("stored_length");
        originalLength = meta.fieldIndex("original_length");
        messageChecksum = meta.fieldIndex("message_checksum");
        lengthDeferred = meta.fieldIndex("length_deferred");
        dataChecksum = meta.fieldIndex("data_checksum");
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
        return pass(sorted, maxMessageSize, emitClean, emitDirty, null, 0);
    }

    /**
     * The clean rows of {@code sorted}; every other group goes to a {@link SideFile} in {@code sideDir}
     * (a directory every executor sees) as the query runs. {@code skHeader}: where the header starts
     * in a routable row's {@code sk}.
     */
    public static Dataset<Row> split(Dataset<Row> sorted, long maxMessageSize, String sideDir, int skHeader) {
        return pass(sorted, maxMessageSize, true, false, sideDir, skHeader);
    }

    private static Dataset<Row> pass(Dataset<Row> sorted, long maxMessageSize, boolean emitClean, boolean emitDirty,
        String sideDir, int skHeader) {
        StructType meta = (StructType) sorted.schema().apply("m").dataType();
        Reassemble pass = new Reassemble(meta, maxMessageSize, emitClean, emitDirty, sideDir, skHeader);
        return Plans.frame(sorted, Plans.rows(sorted).toJavaRDD().mapPartitions(pass).rdd(), outputSchema(meta));
    }

    @Override
    public Iterator<InternalRow> call(Iterator<InternalRow> input) {
        SideFile side = sideDir == null ? null : new SideFile(sideDir, skHeader, sk, far, isNull, plen, src, srcType);
        return new Groups(input, side);
    }

    /** A binary column of a row the sorter may overwrite: a view while the row lasts, else a copy. */
    private static BinaryView view(InternalRow row, int i) {
        return row.isNullAt(i) ? null : row.getBinaryView(i);
    }

    private static boolean same(BinaryView a, BinaryView b) {
        return a == null ? b == null : a.equals(b);
    }

    private boolean eq(InternalRow a, InternalRow b, int i) {
        return !a.isNullAt(i) && !b.isNullAt(i) && a.get(i, metaTypes[i]).equals(b.get(i, metaTypes[i]));
    }

    /** SQL's {@code m.x IS NULL OR m.x = last.x}. */
    private boolean agrees(InternalRow m, InternalRow last, int i) {
        return m.isNullAt(i) || eq(m, last, i);
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

        Groups(Iterator<InternalRow> input, SideFile side) {
            this.input = input;
            this.side = side;
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
            long end = size + piece.numBytes();
            if (end > MAX_ARRAY) {
                throw new IllegalStateException("an aggregate of " + end + " bytes: over Spark's 2 GiB cap on a value");
            }
            if (end > buffer.length) {
                buffer = Arrays.copyOf(buffer, (int) Math.min(MAX_ARRAY, Math.max(end, 2L * buffer.length)));
            }
            piece.writeToMemory(buffer, Platform.BYTE_ARRAY_OFFSET + size);
            return end;
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
            List<InternalRow> metas = new ArrayList<>();
            long size = 0;
            boolean ok = routable && bk == null;
            long crc = 0;
            InternalRow previous = null;
            while (true) {
                InternalRow m = row.getStruct(5, metaFields).copy(); // kept past the sorter's next row
                metas.add(m);
                BinaryView piece = view(row, 3);
                int length = piece == null ? 0 : piece.numBytes();
                if (length > 0) {
                    size = append(piece, size);
                }
                if (ok) {
                    ok = !row.isNullAt(4) && row.getBoolean(4) && !m.isNullAt(offset) && !m.isNullAt(dataChecksum);
                    if (ok && previous == null) {
                        ok = m.getLong(offset) == 0;
                    } else if (ok) { // the previous row is not LAST and this one follows it
                        ok = !previous.isNullAt(isLast) && !previous.getBoolean(isLast) && !previous.isNullAt(dataLength)
                            && m.getLong(offset) == previous.getLong(offset) + previous.getLong(dataLength);
                    }
                    if (ok) {
                        crc = Crc32Combine.combine(crc, m.getLong(dataChecksum), length);
                    }
                }
                previous = m;
                ahead = input.hasNext() ? input.next() : null;
                if (ahead == null || ahead.getBoolean(0) != routable || !same(pkView, view(ahead, 1))
                    || !same(bkView, view(ahead, 2))) {
                    break;
                }
                row = ahead;
            }
            InternalRow last = previous;
            if (ok) {
                ok = !last.isNullAt(isLast) && last.getBoolean(isLast) && eq(last, last, messageChecksum)
                    && last.getLong(messageChecksum) == crc && size <= maxMessageSize;
            }
            if (ok) {
                for (InternalRow m : metas) {
                    if (!eq(m, last, lengthDeferred) || !agrees(m, last, storedLength)
                        || !agrees(m, last, originalLength) || !agrees(m, last, messageChecksum)) {
                        ok = false;
                        break;
                    }
                }
            }
            if (!ok && side != null) {
                side.write(routable, bk != null, metas, buffer);
            }
            InternalRow out = null;
            if (ok ? emitClean : emitDirty) {
                // the pieces' own lengths, no declared length; the buffer itself when they fill it (see the class doc)
                byte[] blob = size == buffer.length ? buffer : Arrays.copyOf(buffer, (int) size);
                Object meta = ok ? null : new GenericArrayData(metas.toArray());
                if (src < 0) {
                    out = new GenericInternalRow(new Object[] {routable, pk, bk, blob, metas.size(), last, meta, ok});
                } else { // a clean row's kept columns, row by row; the judge reads them from meta
                    Object sources = ok ? new GenericArrayData(metas.stream().map(m -> m.get(src, srcType)).toArray())
                        : null;
                    out = new GenericInternalRow(
                        new Object[] {routable, pk, bk, blob, metas.size(), last, meta, ok, sources});
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
