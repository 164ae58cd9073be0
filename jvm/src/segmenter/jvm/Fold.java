package segmenter.jvm;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The clean test's cross-row rules over one message's rows in offset order, folded as the rows come:
 * the one statement of them on the JVM side, read by the pass after the shuffle ({@link Reassemble})
 * and by the scan's ({@link Stage}).
 *
 * <p>The rules: one message from offset 0, contiguous, exactly one LAST at the end, header fields
 * agreeing with the last row's, at most {@code maxMessageSize} bytes, and the message CRC, folded from
 * the segments' CRCs that the per-row rules ({@code row_ok}, generated from the header table in SQL)
 * have verified against their data ({@link Crc32Combine}), so no byte is read twice. A row's meta
 * struct is the one the Python judge reads (reassembly/spark/engine/bridge.py, {@code META}).
 */
final class Fold {
    private final long maxMessageSize;
    private final DataType[] metaTypes;
    private final int offset, dataLength, isLast, storedLength, originalLength, messageChecksum;
    private final int lengthDeferred, dataChecksum;

    private boolean ok;
    private long crc;
    private long size;
    private InternalRow previous;
    private List<InternalRow> metas = new ArrayList<>();

    Fold(StructType meta, long maxMessageSize) {
        this.maxMessageSize = maxMessageSize;
        metaTypes = java.util.Arrays.stream(meta.fields()).map(StructField::dataType).toArray(DataType[]::new);
        offset = meta.fieldIndex("offset");
        dataLength = meta.fieldIndex("data_length");
        isLast = meta.fieldIndex("is_last");
        storedLength = meta.fieldIndex("stored_length");
        originalLength = meta.fieldIndex("original_length");
        messageChecksum = meta.fieldIndex("message_checksum");
        lengthDeferred = meta.fieldIndex("length_deferred");
        dataChecksum = meta.fieldIndex("data_checksum");
    }

    /** A new message; {@code eligible}: it may be clean at all (a routable message's main key). */
    void start(boolean eligible) {
        ok = eligible;
        crc = 0;
        size = 0;
        previous = null;
        metas = new ArrayList<>();
    }

    /**
     * The next row: its meta struct ({@code m}, which must outlive the sorter's row: a copy, or a view
     * of a row that does), whether its per-row rules hold, its piece's length.
     */
    void add(InternalRow m, boolean rowOk, int length) {
        metas.add(m);
        size += length;
        if (ok) {
            ok = rowOk && !m.isNullAt(offset) && !m.isNullAt(dataChecksum);
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
    }

    /** Whether the rows so far may still begin a clean message. */
    boolean possible() {
        return ok;
    }

    /** Whether a message whose first row has meta {@code m} and per-row verdict {@code rowOk} may be clean. */
    boolean opens(InternalRow m, boolean rowOk) {
        return rowOk && !m.isNullAt(offset) && m.getLong(offset) == 0;
    }

    long size() {
        return size;
    }

    /** The metas added since {@link #start}, in order (a new list per message). */
    List<InternalRow> metas() {
        return metas;
    }

    InternalRow last() {
        return previous;
    }

    /** The verdict on the rows added: a complete message by every rule (the class doc). */
    boolean clean() {
        InternalRow last = previous;
        if (!ok || last == null || last.isNullAt(isLast) || !last.getBoolean(isLast) || !eq(last, last, messageChecksum)
            || last.getLong(messageChecksum) != crc || size > maxMessageSize) {
            return false;
        }
        for (InternalRow m : metas) {
            if (!eq(m, last, lengthDeferred) || !agrees(m, last, storedLength) || !agrees(m, last, originalLength)
                || !agrees(m, last, messageChecksum)) {
                return false;
            }
        }
        return true;
    }

    private boolean eq(InternalRow a, InternalRow b, int i) {
        return !a.isNullAt(i) && !b.isNullAt(i) && a.get(i, metaTypes[i]).equals(b.get(i, metaTypes[i]));
    }

    /** SQL's {@code m.x IS NULL OR m.x = last.x}. */
    private boolean agrees(InternalRow m, InternalRow last, int i) {
        return m.isNullAt(i) || eq(m, last, i);
    }
}
