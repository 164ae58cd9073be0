/* segmenter._fastwire: decode_segment in C, for a broker receive's per-segment cost.

   Optional: the package works the same without it (pyproject.toml builds it when a C compiler is
   there, and segmenter.wire falls back to the Python decoder when it is not). It accepts a segment
   only when every rule of the header table holds (the rules are rendered into _fastwire_table.h from
   segmenter/header_table.py, as the Python decoder and the SQL are) and its data checksum matches;
   for anything else it calls the Python decoder with the same arguments, so every error, and every
   input that is not a flat byte buffer, is the Python decoder's business, byte for byte. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef __int128 i128;

static uint32_t crc_table[256];

/* CRC-32/IEEE of a header (at most MAX_HEADER_LENGTH bytes): a table is fast enough for that. */
static i128 crc32_ieee(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return (i128)(c ^ 0xFFFFFFFFu);
}

/* The unsigned big-endian integer of ``w`` bytes (at most 8) at ``p``. */
static inline i128 be(const unsigned char *p, int w) {
    uint64_t v = 0;
    for (int i = 0; i < w; i++) v = (v << 8) | p[i];
    return (i128)v;
}

#include "_fastwire_table.h"

/* Set by configure(): what the segment is built of, and the Python decoder for everything else. */
static PyObject *header_type, *segment_type, *codecs, *algorithms, *data_crcs, *fallback;
static PyObject *kw_max_segment_size, *kw_max_message_size, *kw_verify, *zero;
static i128 default_max_segment_size, default_max_message_size, max_header_length;

static PyObject *fall_back(PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
}

/* An int argument as i128; 0 (no exception set) when it is not an int that fits 64 bits. */
static int int_arg(PyObject *o, i128 *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return 1;
}

static PyObject *new_tuple(PyObject *type, PyObject **items, Py_ssize_t n) {
    /* As tuple.__new__(type, items) does for a tuple subclass (a NamedTuple: no __dict__). */
    PyObject *t = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL) {
            for (Py_ssize_t j = i + 1; j < n; j++) Py_XDECREF(items[j]);
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

static PyObject *member(PyObject *table, i128 index) {
    /* table[index] (a tuple with None where no member has that number), new reference; NULL: none. */
    if (index < 0 || index >= PyTuple_GET_SIZE(table)) return NULL;
    PyObject *m = PyTuple_GET_ITEM(table, (Py_ssize_t)index);
    return m == Py_None ? NULL : Py_NewRef(m);
}

static PyObject *decode_segment(PyObject *Py_UNUSED(self), PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    i128 max_segment_size = default_max_segment_size, max_message_size = default_max_message_size;
    int verify = 1;
    if (nargs != 1 || fallback == NULL) return fall_back(args, nargsf, kwnames);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        int ok;
        if (key == kw_max_segment_size || PyUnicode_Compare(key, kw_max_segment_size) == 0) {
            ok = int_arg(value, &max_segment_size);
        } else if (key == kw_max_message_size || PyUnicode_Compare(key, kw_max_message_size) == 0) {
            ok = int_arg(value, &max_message_size);
        } else if (key == kw_verify || PyUnicode_Compare(key, kw_verify) == 0) {
            /* True or False; anything else (whose truth is its own code's to say) goes to Python */
            verify = value == Py_True;
            ok = verify || value == Py_False;
        } else {
            ok = 0;
        }
        if (!ok) return fall_back(args, nargsf, kwnames);
    }
    PyObject *view = PyMemoryView_FromObject(args[0]);
    if (view == NULL) {
        PyErr_Clear();
        return fall_back(args, nargsf, kwnames);
    }
    Py_buffer *buf = PyMemoryView_GET_BUFFER(view);
    fields f;
    if (buf->ndim != 1 || buf->itemsize != 1 || !PyBuffer_IsContiguous(buf, 'C') ||
        !verdict((const unsigned char *)buf->buf, (i128)buf->len, max_message_size, max_header_length,
                 max_segment_size, &f)) {
        Py_DECREF(view);
        return fall_back(args, nargsf, kwnames);
    }
    const unsigned char *b = (const unsigned char *)buf->buf;
    Py_ssize_t header_length = (Py_ssize_t)f.header_length;
    PyObject *data = PySequence_GetSlice(view, header_length, buf->len);
    PyObject *crc_fn = member(data_crcs, f.algorithm);
    if (data == NULL || crc_fn == NULL) goto fail;
    if (verify) {
        PyObject *call[2] = {data, zero};
        PyObject *crc = PyObject_Vectorcall(crc_fn, call, 2, NULL);
        if (crc == NULL) goto fail;
        unsigned long long actual = PyLong_AsUnsignedLongLong(crc);
        Py_DECREF(crc);
        if (PyErr_Occurred() || (i128)actual != f.data_checksum) goto fail; /* the Python decoder explains */
    }
    Py_CLEAR(crc_fn);
    PyObject *items[14] = {
        PyBytes_FromStringAndSize((const char *)f.group_id, 24),
        PyLong_FromUnsignedLongLong((unsigned long long)f.msg_seq_number),
        PyLong_FromUnsignedLongLong((unsigned long long)f.offset),
        PyLong_FromUnsignedLongLong((unsigned long long)f.data_length),
        PyLong_FromUnsignedLongLong((unsigned long long)f.original_length),
        PyLong_FromUnsignedLongLong((unsigned long long)f.stored_length),
        PyLong_FromUnsignedLongLong((unsigned long long)f.msg_flags),
        member(codecs, f.codec),
        member(algorithms, f.algorithm),
        PyLong_FromUnsignedLongLong((unsigned long long)f.data_checksum),
        f.has_message_checksum ? PyLong_FromUnsignedLongLong((unsigned long long)f.message_checksum)
                               : Py_NewRef(Py_None),
        PyLong_FromSsize_t(header_length),
        PyBool_FromLong(f.length_deferred),
        PyBytes_FromStringAndSize((const char *)b + FIXED_LENGTH, header_length - HEADER_LENGTH),
    };
    PyObject *header = new_tuple(header_type, items, 14);
    Py_DECREF(view);
    if (header == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *pair[2] = {header, data};
    return new_tuple(segment_type, pair, 2);
fail:
    Py_XDECREF(crc_fn);
    Py_XDECREF(data);
    Py_DECREF(view);
    PyErr_Clear();
    return fall_back(args, nargsf, kwnames);
}

static const char *const FIELD_ORDER[14] = {
    "group_id", "msg_seq_number", "offset", "data_length", "original_length", "stored_length", "msg_flags",
    "codec", "algorithm", "data_checksum", "message_checksum", "header_length", "length_deferred", "extension",
};

static PyObject *configure(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *h, *s, *c, *a, *d, *fb;
    long long mss, mms, mhl;
    if (!PyArg_ParseTuple(args, "OOO!O!O!OLLL", &h, &s, &PyTuple_Type, &c, &PyTuple_Type, &a, &PyTuple_Type, &d,
                          &fb, &mss, &mms, &mhl))
        return NULL;
    if (!PyType_Check(h) || !PyType_IsSubtype((PyTypeObject *)h, &PyTuple_Type) || !PyType_Check(s) ||
        !PyType_IsSubtype((PyTypeObject *)s, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "the header and segment types must be tuple subclasses");
        return NULL;
    }
    PyObject *names = PyObject_GetAttrString(h, "_fields");
    if (names == NULL) return NULL;
    int same = PyTuple_Check(names) && PyTuple_GET_SIZE(names) == 14;
    for (Py_ssize_t i = 0; same && i < 14; i++)
        same = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(names, i), FIELD_ORDER[i]) == 0;
    Py_DECREF(names);
    if (!same) {
        PyErr_SetString(PyExc_ValueError, "SegmentHeader's fields are not the ones this decoder builds");
        return NULL;
    }
    Py_XSETREF(header_type, Py_NewRef(h));
    Py_XSETREF(segment_type, Py_NewRef(s));
    Py_XSETREF(codecs, Py_NewRef(c));
    Py_XSETREF(algorithms, Py_NewRef(a));
    Py_XSETREF(data_crcs, Py_NewRef(d));
    Py_XSETREF(fallback, Py_NewRef(fb));
    default_max_segment_size = mss;
    default_max_message_size = mms;
    max_header_length = mhl;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_segment", (PyCFunction)(void (*)(void))decode_segment, METH_FASTCALL | METH_KEYWORDS,
     "decode_segment(buf, *, max_segment_size, max_message_size, verify=True): as segmenter.wire's."},
    {"configure", configure, METH_VARARGS,
     "configure(SegmentHeader, Segment, codecs, algorithms, data_crcs, python_decode_segment, "
     "default_max_segment_size, default_max_message_size, max_header_length)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "segmenter._fastwire", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastwire(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    kw_max_segment_size = PyUnicode_InternFromString("max_segment_size");
    kw_max_message_size = PyUnicode_InternFromString("max_message_size");
    kw_verify = PyUnicode_InternFromString("verify");
    zero = PyLong_FromLong(0);
    if (kw_max_segment_size == NULL || kw_max_message_size == NULL || kw_verify == NULL || zero == NULL) return NULL;
    return PyModule_Create(&module);
}
