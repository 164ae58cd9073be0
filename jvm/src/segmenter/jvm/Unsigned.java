package segmenter.jvm;

import java.math.BigInteger;
import java.util.zip.CRC32;

/** The arithmetic {@link HeaderTable}'s generated rules use: unsigned 64-bit values, exact or refused. */
final class Unsigned {
    private Unsigned() {}

    /** The unsigned big-endian integer of {@code width} (at most 8) bytes at {@code at}, as its 64 bits. */
    static long u(byte[] b, int at, int width) {
        long v = 0;
        for (int i = at; i < at + width; i++) {
            v = (v << 8) | (b[i] & 0xFF);
        }
        return v;
    }

    /** The same, exactly. */
    static BigInteger big(byte[] b, int at, int width) {
        return new BigInteger(1, java.util.Arrays.copyOfRange(b, at, at + width));
    }

    /** An index the rules before have bounded (a header length of at most a few KiB). */
    static int index(long v) {
        return Math.toIntExact(v);
    }

    static int index(BigInteger v) {
        return v.intValueExact();
    }

    /** {@code a + b} of unsigned values; ArithmeticException where it is 2^64 or more. */
    static long add(long a, long b) {
        long sum = a + b;
        if (Long.compareUnsigned(sum, a) < 0) {
            throw new ArithmeticException("unsigned overflow");
        }
        return sum;
    }

    /** {@code a - b} of unsigned values; ArithmeticException where it is negative. */
    static long sub(long a, long b) {
        if (Long.compareUnsigned(a, b) < 0) {
            throw new ArithmeticException("negative");
        }
        return a - b;
    }

    /** CRC-32/IEEE of {@code length} bytes at {@code at} (the JDK's, hardware-assisted). */
    static long crc32(byte[] b, int at, int length) {
        CRC32 crc = new CRC32();
        crc.update(b, at, length);
        return crc.getValue();
    }
}
