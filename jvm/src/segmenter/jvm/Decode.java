package segmenter.jvm;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.function.BiConsumer;

import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.XXH64;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.BinaryView;

/**
 * The map side of the one pass: each landing row's header decoded and judged by the header table's
 * rules ({@link HeaderTable}, generated from segmenter/header_table.py like the Python decoder and the
 * SQL), and its keys: the columns {@code jvm.route} computes over {@code decode_segments}' SQL
 * (reassembly/spark/batch/grouping.py), from one compiled function instead of some forty SQL expressions that a
 * fresh JVM generates, compiles and warms up per query.
 *
 * <p>Input: one binary column (the encoded segment, NULL allowed), read from the scan's column
 * batches when it has them (each value a view, no copy: {@link Plans#batches}), else from its rows.
 * Output: {@link #SCHEMA}, the same values as the SQL for every column of a routable row; for a row
 * that is not routable, the columns only a routable row's rules read (its fields, flags and lengths)
 * are NULL: nothing reads them (the one pass and the Python judge read a non-routable row's
 * {@code sk}, {@code piece}, {@code plen}, {@code far} and {@code is_null} only), where the SQL reads
 * what bytes there are.
 * A far row (offset at or past {@code largeMessageBytes}) comes out twice, as in {@code jvm.route}.
 *
 * <p>Lineage: an input with a second column (a struct of the input columns kept, {@code src}) is
 * read row by row, and each output row carries that struct unchanged as its last column.
 */
public final class Decode implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    private static final long SEED = 42L; // Spark's xxhash64 seed
    private static final int SK_HEADER = HeaderTable.WIDTH_MSG_SEQ_NUMBER + HeaderTable.WIDTH_OFFSET;

    /** The columns of {@code jvm.route}'s output that the one pass's input reads, with their SQL types. */
    public static final StructType SCHEMA = schema(
        "routable", DataTypes.BooleanType, "pk", DataTypes.BinaryType, "bk", DataTypes.BinaryType,
        "piece", DataTypes.BinaryType, "plen", DataTypes.IntegerType, "sk", DataTypes.BinaryType,
        "far", DataTypes.BooleanType, "is_null", DataTypes.BooleanType, "header_ok", DataTypes.BooleanType,
        "data_ok", DataTypes.BooleanType, "is_last", DataTypes.BooleanType, "in_group", DataTypes.BooleanType,
        "codec", DataTypes.LongType, "algorithm", DataTypes.LongType, "msg_seq_number", DataTypes.IntegerType,
        "offset", DataTypes.LongType, "data_length", DataTypes.LongType, "stored_length", DataTypes.LongType,
        "original_length", DataTypes.LongType, "message_checksum", DataTypes.LongType,
        "length_deferred", DataTypes.BooleanType, "data_checksum", DataTypes.LongType,
        "header_length", DataTypes.LongType);
    // Each column's place in a row of SCHEMA.
    private static final int C_ROUTABLE = SCHEMA.fieldIndex("routable");
    private static final int C_PK = SCHEMA.fieldIndex("pk");
    private static final int C_BK = SCHEMA.fieldIndex("bk");
    private static final int C_PIECE = SCHEMA.fieldIndex("piece");
    private static final int C_PLEN = SCHEMA.fieldIndex("plen");
    private static final int C_SK = SCHEMA.fieldIndex("sk");
    private static final int C_FAR = SCHEMA.fieldIndex("far");
    private static final int C_IS_NULL = SCHEMA.fieldIndex("is_null");
    private static final int C_HEADER_OK = SCHEMA.fieldIndex("header_ok");
    private static final int C_DATA_OK = SCHEMA.fieldIndex("data_ok");
    private static final int C_IS_LAST = SCHEMA.fieldIndex("is_last");
    private static final int C_IN_GROUP = SCHEMA.fieldIndex("in_group");
    private static final int C_CODEC = SCHEMA.fieldIndex("codec");
    private static final int C_ALGORITHM = SCHEMA.fieldIndex("algorithm");
    private static final int C_MSG_SEQ_NUMBER = SCHEMA.fieldIndex("msg_seq_number");
    private static final int C_OFFSET = SCHEMA.fieldIndex("offset");
    private static final int C_DATA_LENGTH = SCHEMA.fieldIndex("data_length");
    private static final int C_STORED_LENGTH = SCHEMA.fieldIndex("stored_length");
    private static final int C_ORIGINAL_LENGTH = SCHEMA.fieldIndex("original_length");
    private static final int C_MESSAGE_CHECKSUM = SCHEMA.fieldIndex("message_checksum");
    private static final int C_LENGTH_DEFERRED = SCHEMA.fieldIndex("length_deferred");
    private static final int C_DATA_CHECKSUM = SCHEMA.fieldIndex("data_checksum");
    private static final int C_HEADER_LENGTH = SCHEMA.fieldIndex("header_length");

    private static final int C_SRC = SCHEMA.size(); // the kept columns' struct, when kept: the last column

    private final long maxMessageSize, maxHeaderLength, maxSegmentSize;
    private final long largeMessageBytes; // negative: no far rows
    private final long crc32; // the CRC-32/IEEE algorithm id: its data checksum is verified here
    private final int srcFields; // fields of the kept columns' struct; negative: nothing kept

    private Decode(long maxMessageSize, long maxHeaderLength, long maxSegmentSize, long largeMessageBytes, long crc32,
        int srcFields) {
        this.maxMessageSize = maxMessageSize;
        this.maxHeaderLength = maxHeaderLength;
        this.maxSegmentSize = maxSegmentSize;
        this.largeMessageBytes = largeMessageBytes;
        this.crc32 = crc32;
        this.srcFields = srcFields;
    }

    private static StructType schema(Object... pairs) {
        StructField[] fields = new StructField[pairs.length / 2];
        for (int i = 0; i < fields.length; i++) {
            fields[i] = DataTypes.createStructField((String) pairs[2 * i], (DataType) pairs[2 * i + 1], true);
        }
        return new StructType(fields);
    }

    /**
     * {@code segments} (one binary column, then optionally the kept columns' struct) decoded, lazily;
     * {@code largeMessageBytes} negative: none far.
     */
    public static Dataset<Row> run(Dataset<Row> segments, long maxMessageSize, long maxHeaderLength,
        long maxSegmentSize, long largeMessageBytes, long crc32) {
        StructType in = segments.schema();
        if (in.size() > 1) {
            StructType src = (StructType) in.fields()[1].dataType();
            Decode decode = new Decode(maxMessageSize, maxHeaderLength, maxSegmentSize, largeMessageBytes, crc32,
                src.size());
            JavaRDD<InternalRow> rows = Plans.rows(segments).toJavaRDD().mapPartitions(decode::keptRows);
            return Plans.frame(segments, rows.rdd(), SCHEMA.add("src", src, true));
        }
        Decode decode = new Decode(maxMessageSize, maxHeaderLength, maxSegmentSize, largeMessageBytes, crc32, -1);
        RDD<ColumnarBatch> batches = Plans.batches(segments);
        JavaRDD<InternalRow> rows = batches != null
            ? batches.toJavaRDD().mapPartitions(input -> decode.rows(batchValues(input)))
            : Plans.rows(segments).toJavaRDD().mapPartitions(input -> decode.rows(rowValues(input)));
        return Plans.frame(segments, rows.rdd(), SCHEMA);
    }

    /** Whether {@link #run} reads {@code segments}' column batches rather than its rows (for the tests). */
    public static boolean columnar(Dataset<Row> segments) {
        return Plans.batches(segments) != null;
    }

    /** Each row's value: a view valid until the next, or null for NULL. */
    private static Iterator<BinaryView> rowValues(Iterator<InternalRow> rows) {
        return new Iterator<BinaryView>() {
            @Override
            public boolean hasNext() {
                return rows.hasNext();
            }

            @Override
            public BinaryView next() {
                InternalRow row = rows.next();
                return row.isNullAt(0) ? null : row.getBinaryView(0);
            }
        };
    }

    /** Each batch's values in order: views of the reader's memory, valid until the next batch. */
    private static Iterator<BinaryView> batchValues(Iterator<ColumnarBatch> batches) {
        return new Iterator<BinaryView>() {
            private ColumnVector column;
            private int at, end;

            @Override
            public boolean hasNext() {
                while (at == end && batches.hasNext()) {
                    ColumnarBatch batch = batches.next();
                    column = batch.column(0);
                    at = 0;
                    end = batch.numRows();
                }
                return at < end;
            }

            @Override
            public BinaryView next() {
                if (!hasNext()) {
                    throw new NoSuchElementException();
                }
                int row = at++;
                return column.isNullAt(row) ? null : column.getBinaryView(row);
            }
        };
    }

    /** The output rows of rows (value, kept columns): each carries its kept columns, copied out of the row. */
    private Iterator<InternalRow> keptRows(Iterator<InternalRow> input) {
        return expand(input, (row, out) -> {
            InternalRow src = row.isNullAt(1) ? null : row.getStruct(1, srcFields).copy();
            decode(row.isNullAt(0) ? null : row.getBinaryView(0), src, out);
        });
    }

    /** The output rows of {@code input}'s values. */
    private Iterator<InternalRow> rows(Iterator<BinaryView> input) {
        return expand(input, (value, out) -> decode(value, null, out));
    }

    /** The rows {@code one} makes of each input, one input at a time: each is read before the next is asked for. */
    private static <T> Iterator<InternalRow> expand(Iterator<T> input, BiConsumer<T, ArrayDeque<InternalRow>> one) {
        return new Iterator<InternalRow>() {
            private final ArrayDeque<InternalRow> ready = new ArrayDeque<>(2);

            @Override
            public boolean hasNext() {
                return !ready.isEmpty() || input.hasNext();
            }

            @Override
            public InternalRow next() {
                if (ready.isEmpty()) {
                    if (!input.hasNext()) {
                        throw new NoSuchElementException();
                    }
                    one.accept(input.next(), ready);
                }
                return ready.poll();
            }
        };
    }

    /**
     * The output row(s) of one input row ({@code segment}: a view of the scan's row, valid until the
     * next; {@code src}: its kept columns, or null). Only the header is copied for the rules; the piece
     * once, straight from the view.
     */
    private void decode(BinaryView segment, InternalRow src, ArrayDeque<InternalRow> out) {
        int length = segment == null ? 0 : segment.numBytes();
        byte[] header = segment == null ? null : bytes(segment, 0, headerBytes(segment));
        int verdict = segment == null ? 0
            : HeaderTable.verdict(header, length, maxMessageSize, maxHeaderLength, maxSegmentSize);
        Object[] v = new Object[srcFields < 0 ? SCHEMA.size() : SCHEMA.size() + 1];
        if (srcFields >= 0) {
            v[C_SRC] = src;
        }
        v[C_IS_NULL] = segment == null;
        v[C_HEADER_OK] = verdict == 2;
        v[C_FAR] = false;
        if (verdict == 0) { // keyed by a hash of its bytes, judged by the Python decoder
            byte[] raw = segment == null ? null : bytes(segment, 0, length);
            long hash = raw == null ? SEED : XXH64.hashUnsafeBytes(raw, Platform.BYTE_ARRAY_OFFSET, length, SEED);
            v[C_ROUTABLE] = false;
            v[C_PK] = Long.toString(hash).getBytes(StandardCharsets.UTF_8);
            v[C_PIECE] = raw;
            v[C_PLEN] = length;
            v[C_SK] = raw == null ? new byte[0] : raw;
            v[C_DATA_OK] = false;
            v[C_IS_LAST] = false;
            out.add(new GenericInternalRow(v));
            return;
        }
        boolean ok = verdict == 2;
        int headerLength = (int) Unsigned.u(header, HeaderTable.AT_HEADER_LENGTH, HeaderTable.WIDTH_HEADER_LENGTH);
        long algorithm = Unsigned.u(header, HeaderTable.AT_ALGORITHM, HeaderTable.WIDTH_ALGORITHM);
        long msgFlags = Unsigned.u(header, HeaderTable.AT_MSG_FLAGS, HeaderTable.WIDTH_MSG_FLAGS);
        long headerFlags = Unsigned.u(header, HeaderTable.AT_HEADER_FLAGS, HeaderTable.WIDTH_HEADER_FLAGS);
        long seq = Unsigned.u(header, HeaderTable.AT_MSG_SEQ_NUMBER, HeaderTable.WIDTH_MSG_SEQ_NUMBER);
        long dataChecksum = Unsigned.u(header, HeaderTable.AT_DATA_CHECKSUM, HeaderTable.WIDTH_DATA_CHECKSUM);
        Long offset = signed(Unsigned.u(header, HeaderTable.AT_OFFSET, HeaderTable.WIDTH_OFFSET));
        boolean last = HeaderTable.last(msgFlags);
        byte[] piece = bytes(segment, headerLength, length - headerLength);
        v[C_ROUTABLE] = true;
        v[C_PK] = slice(header, HeaderTable.AT_GROUP_ID, HeaderTable.WIDTH_GROUP_ID);
        v[C_PIECE] = piece;
        v[C_PLEN] = piece.length;
        byte[] sk = new byte[SK_HEADER + headerLength];
        System.arraycopy(header, HeaderTable.AT_MSG_SEQ_NUMBER, sk, 0, HeaderTable.WIDTH_MSG_SEQ_NUMBER);
        System.arraycopy(header, HeaderTable.AT_OFFSET, sk, HeaderTable.WIDTH_MSG_SEQ_NUMBER, HeaderTable.WIDTH_OFFSET);
        System.arraycopy(header, 0, sk, SK_HEADER, headerLength);
        v[C_SK] = sk;
        // SQL: CASE WHEN NOT header_ok THEN false WHEN algorithm = CRC-32 THEN crc32(data) = data_checksum END
        v[C_DATA_OK] = !ok ? Boolean.FALSE
            : algorithm == crc32 ? (Object) (Unsigned.crc32(piece, 0, piece.length) == dataChecksum) : null;
        v[C_IS_LAST] = ok && last;
        v[C_IN_GROUP] = HeaderTable.inGroup(msgFlags);
        v[C_CODEC] = Unsigned.u(header, HeaderTable.AT_CODEC, HeaderTable.WIDTH_CODEC);
        v[C_ALGORITHM] = algorithm;
        v[C_MSG_SEQ_NUMBER] = seq <= Integer.MAX_VALUE ? (Object) (int) seq : null;
        v[C_OFFSET] = offset;
        v[C_DATA_LENGTH] = Unsigned.u(header, HeaderTable.AT_DATA_LENGTH, HeaderTable.WIDTH_DATA_LENGTH);
        v[C_STORED_LENGTH] = signed(Unsigned.u(header, HeaderTable.AT_STORED_LENGTH, HeaderTable.WIDTH_STORED_LENGTH));
        v[C_ORIGINAL_LENGTH] = signed(Unsigned.u(header, HeaderTable.AT_ORIGINAL_LENGTH, HeaderTable.WIDTH_ORIGINAL_LENGTH));
        v[C_MESSAGE_CHECKSUM] = HeaderTable.hasMessageChecksum(headerFlags)
            ? (Object) Unsigned.u(header, HeaderTable.AT_MESSAGE_CHECKSUM, HeaderTable.WIDTH_MESSAGE_CHECKSUM) : null;
        v[C_LENGTH_DEFERRED] = HeaderTable.lengthDeferred(headerFlags);
        v[C_DATA_CHECKSUM] = dataChecksum;
        v[C_HEADER_LENGTH] = (long) headerLength;
        // far: at or past the threshold, or an offset no long holds (SQL: coalesce(offset >= T, true))
        if (largeMessageBytes >= 0 && (offset == null || offset >= largeMessageBytes)) {
            Object[] meta = v.clone(); // copy 0: the row's facts in its message's aggregate, without its piece
            meta[C_PIECE] = null;
            meta[C_PLEN] = 0;
            meta[C_FAR] = true;
            out.add(new GenericInternalRow(meta));
            v[C_BK] = slice(header, HeaderTable.AT_OFFSET, HeaderTable.WIDTH_OFFSET);
        }
        out.add(new GenericInternalRow(v));
    }

    /**
     * How many leading bytes the rules may read: the header the segment declares, its declared length
     * held to {@code HEADER_LENGTH..maxHeaderLength} (outside, a rule refuses it after the prefix), and
     * never more than there are. Not the whole {@code maxHeaderLength}: a 4 KiB copy per row was a
     * quarter of a 16 KiB segment.
     */
    private int headerBytes(BinaryView segment) {
        int length = segment.numBytes();
        if (length < HeaderTable.PREFIX_LENGTH) {
            return length;
        }
        long declared = 0;
        int at = HeaderTable.AT_HEADER_LENGTH;
        for (int i = at; i < at + HeaderTable.WIDTH_HEADER_LENGTH; i++) {
            declared = (declared << 8) | (segment.getByte(i) & 0xFF);
        }
        long within = Math.min(Math.max(declared, HeaderTable.HEADER_LENGTH), maxHeaderLength);
        return (int) Math.min(length, within);
    }

    /** {@code length} bytes of {@code view} from {@code start}, in an array of their own. */
    private static byte[] bytes(BinaryView view, int start, int length) {
        byte[] out = new byte[length];
        view.slice(start, length).writeToMemory(out, Platform.BYTE_ARRAY_OFFSET);
        return out;
    }

    private static byte[] slice(byte[] header, int at, int width) {
        return Arrays.copyOfRange(header, at, at + width);
    }

    /** A 64-bit unsigned field as SQL's {@code try_cast(... AS BIGINT)}: NULL above 2^63-1. */
    private static Long signed(long value) {
        return value < 0 ? null : value;
    }
}
