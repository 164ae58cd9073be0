package segmenter.jvm;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * One pass over each message's pieces, pre-sorted by key: what {@code listagg} + {@code collect_list}
 * + the SQL clean test did, in one walk (reassembly/spark/jvm.py, {@code fast_aggregate}).
 *
 * <p>Input rows, sorted by (routable, pk, bk, m.sk, m.plen) within each partition:
 * {@code routable, pk, bk, piece, row_ok, m} where {@code row_ok} holds every per-row rule
 * (generated from the header table in SQL) and {@code m} is the row's meta struct (the fields the
 * Python judge reads). Output: one row per key, {@code routable, pk, bk, blob, n, last, meta, clean},
 * the columns of the SQL aggregate plus its clean verdict; {@code meta} is built only for rows
 * that are not clean (the judge's input: clean rows never need it).
 *
 * <p>The cross-row rules (the only ones here): one message from offset 0, contiguous, exactly one
 * LAST at the end, header fields agreeing with the last row's, and the message CRC, folded from
 * the segments' CRCs that {@code row_ok} has verified against their data ({@link Crc32Combine}),
 * so no byte is read twice. Each piece is copied once, into an array of the pieces' summed
 * length (never a declared one), and only for a group whose kind is asked for: a pass emitting
 * only the rows that are not clean copies nothing for a clean message.
 */
public final class Reassemble implements MapPartitionsFunction<Row, Row> {
    private static final long serialVersionUID = 1L;
    private static final int MAX_ARRAY = Integer.MAX_VALUE - 16; // a JVM byte[] (Spark's cap on a value)

    private final long maxMessageSize;
    private final boolean emitClean, emitDirty;
    private final int offset, dataLength, isLast, storedLength, originalLength, messageChecksum;
    private final int lengthDeferred, dataChecksum;

    private Reassemble(StructType meta, long maxMessageSize, boolean emitClean, boolean emitDirty) {
        this.maxMessageSize = maxMessageSize;
        this.emitClean = emitClean;
        this.emitDirty = emitDirty;
        offset = meta.fieldIndex("offset");
        dataLength = meta.fieldIndex("data_length");
        isLast = meta.fieldIndex("is_last");
        storedLength = meta.fieldIndex("stored_length");
        originalLength = meta.fieldIndex("original_length");
        messageChecksum = meta.fieldIndex("message_checksum");
        lengthDeferred = meta.fieldIndex("length_deferred");
        dataChecksum = meta.fieldIndex("data_checksum");
    }

    /** The output schema for input whose meta struct is {@code meta}. */
    public static StructType outputSchema(StructType meta) {
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

    /** {@code sorted} (see the class doc) to one row per key: the clean ones, the others, or both. */
    public static Dataset<Row> run(Dataset<Row> sorted, long maxMessageSize, boolean emitClean, boolean emitDirty) {
        StructType meta = (StructType) sorted.schema().apply("m").dataType();
        Reassemble pass = new Reassemble(meta, maxMessageSize, emitClean, emitDirty);
        return sorted.mapPartitions(pass, Encoders.row(outputSchema(meta)));
    }

    @Override
    public Iterator<Row> call(Iterator<Row> input) {
        return new Groups(input);
    }

    private static boolean sameKey(Row a, Row b) {
        return a.getBoolean(0) == b.getBoolean(0)
            && Arrays.equals((byte[]) a.get(1), (byte[]) b.get(1))
            && Arrays.equals((byte[]) a.get(2), (byte[]) b.get(2));
    }

    private static boolean eq(Row a, Row b, int i) {
        return !a.isNullAt(i) && !b.isNullAt(i) && a.get(i).equals(b.get(i));
    }

    /** SQL's {@code m.x IS NULL OR m.x = last.x}. */
    private static boolean agrees(Row m, Row last, int i) {
        return m.isNullAt(i) || eq(m, last, i);
    }

    /** Groups consecutive rows of one key; yields the groups of the kinds asked for. */
    private final class Groups implements Iterator<Row> {
        private final Iterator<Row> input;
        private Row ahead; // the first row of the next group
        private Row ready; // the next output row

        Groups(Iterator<Row> input) {
            this.input = input;
            this.ahead = input.hasNext() ? input.next() : null;
        }

        @Override
        public boolean hasNext() {
            while (ready == null && ahead != null) {
                ready = group();
            }
            return ready != null;
        }

        @Override
        public Row next() {
            if (!hasNext()) {
                throw new NoSuchElementException();
            }
            Row out = ready;
            ready = null;
            return out;
        }

        /** Consumes one group; its output row, or null when its kind is not asked for. */
        private Row group() {
            Row first = ahead;
            boolean routable = first.getBoolean(0);
            List<Row> metas = new ArrayList<>();
            List<byte[]> pieces = new ArrayList<>();
            long size = 0;
            boolean ok = routable && first.isNullAt(2);
            long crc = 0;
            Row row = first;
            Row previous = null;
            while (true) {
                Row m = row.getStruct(5);
                metas.add(m);
                byte[] piece = (byte[]) row.get(3);
                if (piece != null && piece.length > 0) {
                    pieces.add(piece); // a fresh array per row (Spark's deserializer): kept, not copied
                    size += piece.length;
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
                        crc = Crc32Combine.combine(crc, m.getLong(dataChecksum), piece == null ? 0 : piece.length);
                    }
                }
                previous = m;
                ahead = input.hasNext() ? input.next() : null;
                if (ahead == null || !sameKey(first, ahead)) {
                    break;
                }
                row = ahead;
            }
            Row last = previous;
            if (ok) {
                ok = !last.isNullAt(isLast) && last.getBoolean(isLast) && eq(last, last, messageChecksum)
                    && last.getLong(messageChecksum) == crc && size <= maxMessageSize;
            }
            if (ok) {
                for (Row m : metas) {
                    if (!eq(m, last, lengthDeferred) || !agrees(m, last, storedLength)
                        || !agrees(m, last, originalLength) || !agrees(m, last, messageChecksum)) {
                        ok = false;
                        break;
                    }
                }
            }
            if (!(ok ? emitClean : emitDirty)) {
                return null;
            }
            if (size > MAX_ARRAY) {
                throw new IllegalStateException("an aggregate of " + size + " bytes: over Spark's 2 GiB cap on a value");
            }
            byte[] blob = new byte[(int) size]; // the pieces' own lengths: no declared length sizes anything
            int pos = 0;
            for (byte[] piece : pieces) {
                System.arraycopy(piece, 0, blob, pos, piece.length);
                pos += piece.length;
            }
            Object meta = ok ? null : CollectionConverters.asScala(metas).toSeq();
            return RowFactory.create(routable, first.get(1), first.get(2), blob, metas.size(), last, meta, ok);
        }
    }
}
