/* kvstrata.native._rdb: the two loops of Redis's DUMP payload format that are too slow in Python for KV-cache
 * sized values (kvstrata/protocol/dump_payload.py, which falls back to Python loops without this module):
 *
 * - crc64: Redis's CRC-64 (Jones polynomial, reflected, initial value 0), the payload's checksum. Eight bytes a
 *   step (slicing-by-8): a multi-megabyte value is checked in about a millisecond, where a byte loop in Python
 *   takes a second and holds the event loop.
 * - lzf_decompress: LZF, which Redis applies to strings longer than 20 bytes when it saves them (rdbcompression).
 *   Every back reference is checked against the output written so far: a payload is input from a client.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CRC64_POLY 0x95ac9329ac4bc9b5ULL /* 0xad93d23594c935a9, bit-reversed */
/* Below this the GIL is kept: releasing it costs more than checking the bytes. */
#define RELEASE_GIL_BYTES (1 << 16)

static uint64_t crc_table[8][256];

static void crc_init(void) {
    for (int i = 0; i < 256; i++) {
        uint64_t crc = (uint64_t)i;
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 1) ? (crc >> 1) ^ CRC64_POLY : crc >> 1;
        crc_table[0][i] = crc;
    }
    for (int i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            crc_table[k][i] = (crc_table[k - 1][i] >> 8) ^ crc_table[0][crc_table[k - 1][i] & 0xff];
}

static uint64_t crc64_update(uint64_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        crc ^= word;
        crc = crc_table[7][crc & 0xff] ^ crc_table[6][(crc >> 8) & 0xff] ^ crc_table[5][(crc >> 16) & 0xff] ^
              crc_table[4][(crc >> 24) & 0xff] ^ crc_table[3][(crc >> 32) & 0xff] ^
              crc_table[2][(crc >> 40) & 0xff] ^ crc_table[1][(crc >> 48) & 0xff] ^ crc_table[0][crc >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

static PyObject *rdb_crc64(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc64(data, crc=0)");
        return NULL;
    }
    uint64_t crc = 0;
    if (nargs == 2) {
        crc = PyLong_AsUnsignedLongLong(args[1]);
        if (crc == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    if (view.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc64_update(crc, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc64_update(crc, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(crc);
}

/* liblzf's format: a control byte below 32 starts a run of ctrl + 1 literal bytes; otherwise its top three bits
 * are the match length - 2 (7: a further length byte follows) and its low five bits with the next byte the
 * distance - 1 back into the output. Returns the bytes written, or -1 (corrupt input or output too small). */
static Py_ssize_t lzf_expand(const unsigned char *ip, size_t in_len, unsigned char *out, size_t out_len) {
    const unsigned char *in_end = ip + in_len;
    unsigned char *op = out;
    unsigned char *out_end = out + out_len;
    while (ip < in_end) {
        unsigned int ctrl = *ip++;
        if (ctrl < 32) {
            size_t run = ctrl + 1;
            if ((size_t)(out_end - op) < run || (size_t)(in_end - ip) < run)
                return -1;
            memcpy(op, ip, run);
            op += run;
            ip += run;
            continue;
        }
        size_t len = ctrl >> 5;
        size_t back = (size_t)(ctrl & 0x1f) << 8;
        if (ip >= in_end)
            return -1;
        if (len == 7) {
            len += *ip++;
            if (ip >= in_end)
                return -1;
        }
        back += *ip++;
        len += 2;
        if ((size_t)(op - out) < back + 1 || (size_t)(out_end - op) < len)
            return -1;
        const unsigned char *ref = op - back - 1;
        while (len--) /* byte by byte: the reference may overlap what it produces */
            *op++ = *ref++;
    }
    return op - out;
}

static PyObject *rdb_lzf_decompress(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lzf_decompress(data, length)");
        return NULL;
    }
    Py_ssize_t want = PyLong_AsSsize_t(args[1]);
    if (want < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "negative length");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, want);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t got;
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    if (want >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        got = lzf_expand(view.buf, (size_t)view.len, dst, (size_t)want);
        Py_END_ALLOW_THREADS
    } else {
        got = lzf_expand(view.buf, (size_t)view.len, dst, (size_t)want);
    }
    PyBuffer_Release(&view);
    if (got != want) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "invalid LZF data");
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"crc64", (PyCFunction)(void (*)(void))rdb_crc64, METH_FASTCALL,
     "crc64(data, crc=0) -> int: Redis's CRC-64 of a buffer, continuing from crc."},
    {"lzf_decompress", (PyCFunction)(void (*)(void))rdb_lzf_decompress, METH_FASTCALL,
     "lzf_decompress(data, length) -> bytes: exactly length bytes, else ValueError."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvstrata.native._rdb", "Redis DUMP payload checksum and LZF decompression.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rdb(void) {
    crc_init();
    return PyModule_Create(&module);
}
