package segmenter.jvm;

import java.math.BigInteger;

/** Generated from segmenter/header_table.py by tools/render.py: edit the table, not this file. */
final class HeaderTable {
    static final int PREFIX_LENGTH = 10, FIXED_LENGTH = 80, HEADER_LENGTH = 84, CHECKSUM_WIDTH = 4;
    static final int AT_MAGIC = 0, WIDTH_MAGIC = 4;
    static final int AT_VERSION = 4, WIDTH_VERSION = 1;
    static final int AT_ALGORITHM = 5, WIDTH_ALGORITHM = 1;
    static final int AT_CODEC = 6, WIDTH_CODEC = 1;
    static final int AT_HEADER_FLAGS = 7, WIDTH_HEADER_FLAGS = 1;
    static final int AT_HEADER_LENGTH = 8, WIDTH_HEADER_LENGTH = 2;
    static final int AT_RESERVED = 10, WIDTH_RESERVED = 2;
    static final int AT_MSG_FLAGS = 12, WIDTH_MSG_FLAGS = 4;
    static final int AT_GROUP_ID = 16, WIDTH_GROUP_ID = 24;
    static final int AT_MSG_SEQ_NUMBER = 40, WIDTH_MSG_SEQ_NUMBER = 4;
    static final int AT_DATA_LENGTH = 44, WIDTH_DATA_LENGTH = 4;
    static final int AT_OFFSET = 48, WIDTH_OFFSET = 8;
    static final int AT_ORIGINAL_LENGTH = 56, WIDTH_ORIGINAL_LENGTH = 8;
    static final int AT_STORED_LENGTH = 64, WIDTH_STORED_LENGTH = 8;
    static final int AT_DATA_CHECKSUM = 72, WIDTH_DATA_CHECKSUM = 4;
    static final int AT_MESSAGE_CHECKSUM = 76, WIDTH_MESSAGE_CHECKSUM = 4;
    private static final byte[] C_MAGIC = {83, 71, 77, 84};

    private HeaderTable() {}

    /**
     * The verdict on a segment of {@code total} bytes whose first bytes are {@code b}: at least
     * its declared header length held to HEADER_LENGTH..maxHeaderLength, or all {@code total} if
     * fewer (no rule reads more). 0 the framing fails (not routable), 1 routable but another rule
     * fails, 2 every rule holds.
     */
    static int verdict(byte[] b, long total, long maxMessageSize, long maxHeaderLength, long maxSegmentSize) {
        try {
            return verdict64(b, total, maxMessageSize, maxHeaderLength, maxSegmentSize);
        } catch (ArithmeticException outside64) {
            return verdictExact(b, total, maxMessageSize, maxHeaderLength, maxSegmentSize);
        }
    }

    private static int verdict64(byte[] b, long total, long maxMessageSize, long maxHeaderLength, long maxSegmentSize) {
        long length = total;
        long max_message_size = maxMessageSize;
        long max_header_length = maxHeaderLength;
        long max_segment_size = maxSegmentSize;
        if (!(Long.compareUnsigned(length, 10L) >= 0)) return 0;
        byte[] magic = java.util.Arrays.copyOfRange(b, 0, 4);
        long version = Unsigned.u(b, 4, 1);
        long algorithm = Unsigned.u(b, 5, 1);
        long codec = Unsigned.u(b, 6, 1);
        long header_flags = Unsigned.u(b, 7, 1);
        long header_length = Unsigned.u(b, 8, 2);
        if (!java.util.Arrays.equals(magic, C_MAGIC)) return 0;
        if (!(version == 1L)) return 0;
        if (!((Long.compareUnsigned(header_length, 84L) >= 0) && (Long.compareUnsigned(header_length, max_header_length) <= 0))) return 0;
        if (!(Long.compareUnsigned(length, header_length) >= 0)) return 0;
        long header_checksum = Unsigned.u(b, Unsigned.index(header_length) - 4, 4);
        long header_crc = (Unsigned.crc32(b, 0, Unsigned.index(header_length) - 4));
        if (!(header_checksum == header_crc)) return 0;
        long reserved = Unsigned.u(b, 10, 2);
        long msg_flags = Unsigned.u(b, 12, 4);
        byte[] group_id = java.util.Arrays.copyOfRange(b, 16, 40);
        long msg_seq_number = Unsigned.u(b, 40, 4);
        long data_length = Unsigned.u(b, 44, 4);
        long offset = Unsigned.u(b, 48, 8);
        long original_length = Unsigned.u(b, 56, 8);
        long stored_length = Unsigned.u(b, 64, 8);
        long data_checksum = Unsigned.u(b, 72, 4);
        long message_checksum = Unsigned.u(b, 76, 4);
        boolean has_message_checksum = (!((header_flags & 1L) == 0L));
        boolean length_deferred = (!((header_flags & 2L) == 0L));
        long end = Unsigned.add(offset, data_length);
        boolean segmented = (!((msg_flags & (2L | 4L)) == 0L));
        boolean last = ((!((msg_flags & 4L) == 0L)) || ((msg_flags & 2L) == 0L));
        boolean in_group = (!((msg_flags & (8L | 16L)) == 0L));
        if (!(Long.compareUnsigned(length, max_segment_size) <= 0)) return 1;
        if (!((reserved == 0L) && ((header_flags & (~3L)) == 0L))) return 1;
        if (!((algorithm == 1L) || (algorithm == 2L))) return 1;
        if (!((codec == 0L) || (codec == 1L))) return 1;
        if (!(((long) group_id.length) == 24L)) return 1;
        if (!((Long.compareUnsigned(msg_seq_number, 1L) >= 0) && (Long.compareUnsigned(msg_seq_number, 999999999L) <= 0))) return 1;
        if (!((msg_flags & (~31L)) == 0L)) return 1;
        if (!((original_length == -1L) || (Long.compareUnsigned(original_length, max_message_size) <= 0))) return 1;
        if (!((stored_length == -1L) || (Long.compareUnsigned(stored_length, max_message_size) <= 0))) return 1;
        if (!(Long.compareUnsigned(end, max_message_size) <= 0)) return 1;
        if (!((Long.compareUnsigned(offset, 9223372036854775807L) <= 0) && (Long.compareUnsigned(end, 9223372036854775807L) <= 0))) return 1;
        if (!(segmented || (offset == 0L))) return 1;
        if (!((!(data_length == 0L)) || last)) return 1;
        if (!((stored_length == -1L) || (Long.compareUnsigned(end, stored_length) <= 0))) return 1;
        if (!((stored_length == -1L) || (!last) || (end == stored_length))) return 1;
        if (!((!(stored_length == -1L)) || (!last))) return 1;
        if (!((!(original_length == -1L)) || length_deferred)) return 1;
        if (!((!last) || ((!(original_length == -1L)) && has_message_checksum))) return 1;
        if (!((!(codec == 0L)) || (original_length == -1L) || (stored_length == -1L) || (original_length == stored_length))) return 1;
        if (!(Long.compareUnsigned(Unsigned.sub(length, header_length), data_length) >= 0)) return 1;
        if (!(Long.compareUnsigned(Unsigned.sub(length, header_length), data_length) <= 0)) return 1;
        return 2;
    }

    private static int verdictExact(byte[] b, long total, long maxMessageSize, long maxHeaderLength, long maxSegmentSize) {
        BigInteger length = BigInteger.valueOf(total);
        BigInteger max_message_size = BigInteger.valueOf(maxMessageSize);
        BigInteger max_header_length = BigInteger.valueOf(maxHeaderLength);
        BigInteger max_segment_size = BigInteger.valueOf(maxSegmentSize);
        if (!(length.compareTo(BigInteger.valueOf(10L)) >= 0)) return 0;
        byte[] magic = java.util.Arrays.copyOfRange(b, 0, 4);
        BigInteger version = Unsigned.big(b, 4, 1);
        BigInteger algorithm = Unsigned.big(b, 5, 1);
        BigInteger codec = Unsigned.big(b, 6, 1);
        BigInteger header_flags = Unsigned.big(b, 7, 1);
        BigInteger header_length = Unsigned.big(b, 8, 2);
        if (!java.util.Arrays.equals(magic, C_MAGIC)) return 0;
        if (!(version.compareTo(BigInteger.valueOf(1L)) == 0)) return 0;
        if (!((header_length.compareTo(BigInteger.valueOf(84L)) >= 0) && (header_length.compareTo(max_header_length) <= 0))) return 0;
        if (!(length.compareTo(header_length) >= 0)) return 0;
        BigInteger header_checksum = Unsigned.big(b, Unsigned.index(header_length) - 4, 4);
        BigInteger header_crc = BigInteger.valueOf(Unsigned.crc32(b, 0, Unsigned.index(header_length) - 4));
        if (!(header_checksum.compareTo(header_crc) == 0)) return 0;
        BigInteger reserved = Unsigned.big(b, 10, 2);
        BigInteger msg_flags = Unsigned.big(b, 12, 4);
        byte[] group_id = java.util.Arrays.copyOfRange(b, 16, 40);
        BigInteger msg_seq_number = Unsigned.big(b, 40, 4);
        BigInteger data_length = Unsigned.big(b, 44, 4);
        BigInteger offset = Unsigned.big(b, 48, 8);
        BigInteger original_length = Unsigned.big(b, 56, 8);
        BigInteger stored_length = Unsigned.big(b, 64, 8);
        BigInteger data_checksum = Unsigned.big(b, 72, 4);
        BigInteger message_checksum = Unsigned.big(b, 76, 4);
        boolean has_message_checksum = (!(header_flags.and(BigInteger.valueOf(1L)).compareTo(BigInteger.valueOf(0L)) == 0));
        boolean length_deferred = (!(header_flags.and(BigInteger.valueOf(2L)).compareTo(BigInteger.valueOf(0L)) == 0));
        BigInteger end = offset.add(data_length);
        boolean segmented = (!(msg_flags.and(BigInteger.valueOf(2L).or(BigInteger.valueOf(4L))).compareTo(BigInteger.valueOf(0L)) == 0));
        boolean last = ((!(msg_flags.and(BigInteger.valueOf(4L)).compareTo(BigInteger.valueOf(0L)) == 0)) || (msg_flags.and(BigInteger.valueOf(2L)).compareTo(BigInteger.valueOf(0L)) == 0));
        boolean in_group = (!(msg_flags.and(BigInteger.valueOf(8L).or(BigInteger.valueOf(16L))).compareTo(BigInteger.valueOf(0L)) == 0));
        if (!(length.compareTo(max_segment_size) <= 0)) return 1;
        if (!((reserved.compareTo(BigInteger.valueOf(0L)) == 0) && (header_flags.and(BigInteger.valueOf(3L).not()).compareTo(BigInteger.valueOf(0L)) == 0))) return 1;
        if (!((algorithm.compareTo(BigInteger.valueOf(1L)) == 0) || (algorithm.compareTo(BigInteger.valueOf(2L)) == 0))) return 1;
        if (!((codec.compareTo(BigInteger.valueOf(0L)) == 0) || (codec.compareTo(BigInteger.valueOf(1L)) == 0))) return 1;
        if (!(BigInteger.valueOf(group_id.length).compareTo(BigInteger.valueOf(24L)) == 0)) return 1;
        if (!((msg_seq_number.compareTo(BigInteger.valueOf(1L)) >= 0) && (msg_seq_number.compareTo(BigInteger.valueOf(999999999L)) <= 0))) return 1;
        if (!(msg_flags.and(BigInteger.valueOf(31L).not()).compareTo(BigInteger.valueOf(0L)) == 0)) return 1;
        if (!((original_length.compareTo(new BigInteger("18446744073709551615")) == 0) || (original_length.compareTo(max_message_size) <= 0))) return 1;
        if (!((stored_length.compareTo(new BigInteger("18446744073709551615")) == 0) || (stored_length.compareTo(max_message_size) <= 0))) return 1;
        if (!(end.compareTo(max_message_size) <= 0)) return 1;
        if (!((offset.compareTo(BigInteger.valueOf(9223372036854775807L)) <= 0) && (end.compareTo(BigInteger.valueOf(9223372036854775807L)) <= 0))) return 1;
        if (!(segmented || (offset.compareTo(BigInteger.valueOf(0L)) == 0))) return 1;
        if (!((!(data_length.compareTo(BigInteger.valueOf(0L)) == 0)) || last)) return 1;
        if (!((stored_length.compareTo(new BigInteger("18446744073709551615")) == 0) || (end.compareTo(stored_length) <= 0))) return 1;
        if (!((stored_length.compareTo(new BigInteger("18446744073709551615")) == 0) || (!last) || (end.compareTo(stored_length) == 0))) return 1;
        if (!((!(stored_length.compareTo(new BigInteger("18446744073709551615")) == 0)) || (!last))) return 1;
        if (!((!(original_length.compareTo(new BigInteger("18446744073709551615")) == 0)) || length_deferred)) return 1;
        if (!((!last) || ((!(original_length.compareTo(new BigInteger("18446744073709551615")) == 0)) && has_message_checksum))) return 1;
        if (!((!(codec.compareTo(BigInteger.valueOf(0L)) == 0)) || (original_length.compareTo(new BigInteger("18446744073709551615")) == 0) || (stored_length.compareTo(new BigInteger("18446744073709551615")) == 0) || (original_length.compareTo(stored_length) == 0))) return 1;
        if (!(length.subtract(header_length).compareTo(data_length) >= 0)) return 1;
        if (!(length.subtract(header_length).compareTo(data_length) <= 0)) return 1;
        return 2;
    }

    static boolean hasMessageChecksum(long header_flags) {
        return (!((header_flags & 1L) == 0L));
    }

    static boolean lengthDeferred(long header_flags) {
        return (!((header_flags & 2L) == 0L));
    }

    static boolean last(long msg_flags) {
        return ((!((msg_flags & 4L) == 0L)) || ((msg_flags & 2L) == 0L));
    }

    static boolean inGroup(long msg_flags) {
        return (!((msg_flags & (8L | 16L)) == 0L));
    }
}
