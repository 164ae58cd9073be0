/* Generated from segmenter/header_table.py by tools/render.py: edit the table, not this file. */
#define PREFIX_LENGTH 10
#define FIXED_LENGTH 80
#define HEADER_LENGTH 84
#define CHECKSUM_WIDTH 4

static const unsigned char C_MAGIC[4] = {83, 71, 77, 84};

typedef struct {
    const unsigned char *magic;
    i128 version;
    i128 algorithm;
    i128 codec;
    i128 header_flags;
    i128 header_length;
    i128 reserved;
    i128 msg_flags;
    const unsigned char *group_id;
    i128 msg_seq_number;
    i128 data_length;
    i128 offset;
    i128 original_length;
    i128 stored_length;
    i128 data_checksum;
    i128 message_checksum;
    int has_message_checksum;
    int length_deferred;
} fields;

/* 1 when every rule holds for the segment of ``length`` bytes at ``b`` (its fields in ``f``), else 0.
   Reads no byte past what the rules checked before it: the prefix once ``length`` holds it,
   the rest once the declared header length is in range and present. */
static int verdict(const unsigned char *b, i128 length, i128 max_message_size, i128 max_header_length, i128 max_segment_size, fields *f) {
    if (!(length <= max_segment_size)) return 0;
    if (!(length >= ((i128)10ULL))) return 0;
    f->magic = b + 0;
    f->version = be(b + 4, 1);
    f->algorithm = be(b + 5, 1);
    f->codec = be(b + 6, 1);
    f->header_flags = be(b + 7, 1);
    f->header_length = be(b + 8, 2);
    if (!(memcmp(f->magic, C_MAGIC, 4) == 0)) return 0;
    if (!(f->version == ((i128)1ULL))) return 0;
    if (!((f->header_length >= ((i128)84ULL)) && (f->header_length <= max_header_length))) return 0;
    if (!(length >= f->header_length)) return 0;
    i128 header_checksum = be(b + (Py_ssize_t)f->header_length - 4, 4);
    i128 header_crc = crc32_ieee(b, (Py_ssize_t)f->header_length - 4);
    if (!(header_checksum == header_crc)) return 0;
    f->reserved = be(b + 10, 2);
    f->msg_flags = be(b + 12, 4);
    f->group_id = b + 16;
    f->msg_seq_number = be(b + 40, 4);
    f->data_length = be(b + 44, 4);
    f->offset = be(b + 48, 8);
    f->original_length = be(b + 56, 8);
    f->stored_length = be(b + 64, 8);
    f->data_checksum = be(b + 72, 4);
    f->message_checksum = be(b + 76, 4);
    f->has_message_checksum = ((f->header_flags & ((i128)1ULL)) != ((i128)0ULL));
    f->length_deferred = ((f->header_flags & ((i128)2ULL)) != ((i128)0ULL));
    i128 end = (f->offset + f->data_length);
    i128 segmented = ((f->msg_flags & (((i128)2ULL) | ((i128)4ULL))) != ((i128)0ULL));
    i128 last = (((f->msg_flags & ((i128)4ULL)) != ((i128)0ULL)) || ((f->msg_flags & ((i128)2ULL)) == ((i128)0ULL)));
    if (!((f->reserved == ((i128)0ULL)) && ((f->header_flags & (~((i128)3ULL))) == ((i128)0ULL)))) return 0;
    if (!((f->algorithm == ((i128)1ULL)) || (f->algorithm == ((i128)2ULL)))) return 0;
    if (!((f->codec == ((i128)0ULL)) || (f->codec == ((i128)1ULL)))) return 0;
    if (!(((i128)24ULL) == ((i128)24ULL))) return 0;
    if (!((f->msg_seq_number >= ((i128)1ULL)) && (f->msg_seq_number <= ((i128)999999999ULL)))) return 0;
    if (!((f->msg_flags & (~((i128)31ULL))) == ((i128)0ULL))) return 0;
    if (!((f->original_length == ((i128)18446744073709551615ULL)) || (f->original_length <= max_message_size))) return 0;
    if (!((f->stored_length == ((i128)18446744073709551615ULL)) || (f->stored_length <= max_message_size))) return 0;
    if (!(end <= max_message_size)) return 0;
    if (!((f->offset <= ((i128)9223372036854775807ULL)) && (end <= ((i128)9223372036854775807ULL)))) return 0;
    if (!(segmented || (f->offset == ((i128)0ULL)))) return 0;
    if (!((f->data_length != ((i128)0ULL)) || last)) return 0;
    if (!((f->stored_length == ((i128)18446744073709551615ULL)) || (end <= f->stored_length))) return 0;
    if (!((f->stored_length == ((i128)18446744073709551615ULL)) || (!last) || (end == f->stored_length))) return 0;
    if (!((f->stored_length != ((i128)18446744073709551615ULL)) || (!last))) return 0;
    if (!((f->original_length != ((i128)18446744073709551615ULL)) || f->length_deferred)) return 0;
    if (!((!last) || ((f->original_length != ((i128)18446744073709551615ULL)) && f->has_message_checksum))) return 0;
    if (!((f->codec != ((i128)0ULL)) || (f->original_length == ((i128)18446744073709551615ULL)) || (f->stored_length == ((i128)18446744073709551615ULL)) || (f->original_length == f->stored_length))) return 0;
    if (!((length - f->header_length) >= f->data_length)) return 0;
    if (!((length - f->header_length) <= f->data_length)) return 0;
    return 1;
}
