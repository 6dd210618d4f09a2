/* The Avro fast paths of stream/codec/ in C: field plans (any input schema into columns) and output plans (columns
 * into predictions of any output schema).
 *
 * Each does exactly what its Python version does (stream.codec.reference.decode_columns, the reference decoder, and
 * fastavro record by record in stream.codec.encoder), which stay as the fallback where this extension is not
 * compiled and as the reference the tests compare against; here each record is read or written once, in one pass.
 *
 * No numpy headers: arrays come in as writable buffers (the buffer protocol), allocated by the caller with the
 * right dtype and length, which is checked here. Floats are copied as they are on the wire (little-endian);
 * the module refuses to load on a big-endian host.
 *
 * Why one file of ~800 lines: the plan interpreter (read_ids, run_plan) and the encoder (encode_rows) share the
 * buffer checks, the varint reading and writing and the float copies below, and are one extension module; split
 * in two files they would need a shared header of most of what is here, for no reader's gain.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>


typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* A contiguous buffer of at least `count` items of `itemsize` bytes; `writable` for outputs. */
static int get_buf(PyObject *obj, Buf *b, Py_ssize_t itemsize, Py_ssize_t count, int writable, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    b->held = 1;
    if (b->view.itemsize != itemsize || b->view.len < itemsize * count) {
        PyErr_Format(PyExc_ValueError, "%s: need %zd items of %zd bytes, got %zd bytes of %zd-byte items", name,
                     count, itemsize, b->view.len, b->view.itemsize);
        return -1;
    }
    return 0;
}

static void release(Buf *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

/* Strict UTF-8 check of the bytes, accepting exactly what Python's strict decoder accepts (no overlong forms, no
 * surrogates, nothing past U+10FFFF); needs no GIL. Only called when a byte is >= 0x80. */
static int valid_utf8(const char *text, Py_ssize_t n) {
    const unsigned char *s = (const unsigned char *)text, *end = s + n;
    while (s < end) {
        const unsigned char c = *s;
        if (c < 0x80) {
            s++;
            continue;
        }
        Py_ssize_t len;
        unsigned char lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            else if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            else if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
        } else
            return 0;
        if (end - s < len || s[1] < lo || s[1] > hi) return 0;
        for (Py_ssize_t k = 2; k < len; k++)
            if ((s[k] & 0xC0) != 0x80) return 0;
        s += len;
    }
    return 1;
}

static int has_high(const unsigned char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] & 0x80) return 1;
    return 0;
}

/* Avro long: zigzag varint; returns the bytes written (1..10). */
static inline Py_ssize_t put_long(unsigned char *out, int64_t value) {
    uint64_t zz = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t k = 0;
    while (zz > 0x7F) {
        out[k++] = (unsigned char)((zz & 0x7F) | 0x80);
        zz >>= 7;
    }
    out[k++] = (unsigned char)zz;
    return k;
}

static inline Py_ssize_t long_size(int64_t value) {
    uint64_t zz = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t k = 1;
    while (zz > 0x7F) {
        zz >>= 7;
        k++;
    }
    return k;
}

/* The records of a batch, as the decoder passes them: a list of bytes (None for a tombstone), or (buffer, starts,
 * lengths): every value back to back in one buffer, with int64 starts and lengths (-1: None). */
typedef struct {
    PyObject *list; /* the list form; NULL for the joined form */
    Buf b[3];       /* joined: buffer, starts, lengths */
    Py_ssize_t count;
} Values;

static int values_open(PyObject *obj, Values *v) {
    memset(v, 0, sizeof *v);
    if (PyList_Check(obj)) {
        v->list = obj;
        v->count = PyList_GET_SIZE(obj);
        return 0;
    }
    PyObject *buf, *starts, *lengths;
    if (!PyArg_ParseTuple(obj, "OOO", &buf, &starts, &lengths)) return -1;
    if (PyObject_GetBuffer(buf, &v->b[0].view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    v->b[0].held = 1;
    if (get_buf(lengths, &v->b[2], 8, 0, 0, "lengths") < 0) return -1;
    v->count = v->b[2].view.len / 8;
    return get_buf(starts, &v->b[1], 8, v->count, 0, "starts");
}

/* Value i (0 <= i < count): its bytes, and its length in *len; NULL for None or a value outside its buffer. */
static inline const unsigned char *value_at(const Values *v, Py_ssize_t i, Py_ssize_t *len) {
    if (v->list != NULL) {
        PyObject *item = PyList_GET_ITEM(v->list, i);
        if (!PyBytes_CheckExact(item)) return NULL;
        *len = PyBytes_GET_SIZE(item);
        return (const unsigned char *)PyBytes_AS_STRING(item);
    }
    const int64_t start = ((const int64_t *)v->b[1].view.buf)[i], n = ((const int64_t *)v->b[2].view.buf)[i];
    if (n < 0 || start < 0 || start > v->b[0].view.len || n > v->b[0].view.len - start) return NULL; /* no overflow */
    *len = (Py_ssize_t)n;
    return (const unsigned char *)v->b[0].view.buf + start;
}

/* ---- field plans: any record layout, decoded into columns -------------------------------------------------
 *
 * run_plan runs the flattened program of a stream.codec.plan.FieldPlan (built by plan.flatten) over the bodies of
 * the selected records, writing each taken record's values as one row of the reader's columns. It does what
 * plan.decode_columns (the reference) does, record for record; the tests compare the two.
 *
 * The program is an int32 array; one operation per writer value:
 *   NULL k c1..ck            the null branch of a union: columns c1..ck are null in this row
 *   BOOLEAN col | INT col | LONG col | FLOAT col | DOUBLE col
 *   BYTES col utf8 | STRING col    (a string is checked for UTF-8 where it is stored)
 *   FIXED col size | ENUM col k t1..tk (writer symbol -> reader code, -1: an error)
 *   ARRAY col minsize len item...  (an array column's items are written by the item op, to the same column)
 *   MAP minsize len value...       (read and skipped)
 *   UNION k len1 b1... lenk bk...
 *   RECORD k f1..fk d (col default)*d   (the writer's fields in order; then the reader's defaults)
 *   FAIL why                       (a union branch the reader cannot take: incompatible-schema)
 * col -1: read and skip. A column stores bool (1 byte), int32, int64, float32, float64 or bytes; a value of
 * another type is converted to it (the Avro promotions); variable columns (strings, bytes, fixed, arrays) append
 * to their data and end each row in their offsets. */

enum { OP_NULL, OP_BOOLEAN, OP_INT, OP_LONG, OP_FLOAT, OP_DOUBLE, OP_BYTES, OP_STRING, OP_FIXED, OP_ENUM,
       OP_ARRAY, OP_MAP, OP_UNION, OP_RECORD, OP_FAIL };
enum { ST_BOOL, ST_INT32, ST_INT64, ST_FLOAT32, ST_FLOAT64, ST_BYTE };
/* A record's error (the reason of its dead letter); ERR_ROOM is none: a variable column is full, and the run stops
 * for the caller to give it more room and run the batch again. */
enum { ERR_NONE, ERR_CORRUPT, ERR_INCOMPATIBLE, ERR_BUDGET, ERR_ROOM };
static const Py_ssize_t st_size[] = {1, 4, 8, 4, 8, 1};
/* How deep a plan may nest (run_op recursion): deeper plans are refused by `flatten` when it builds the program
 * (their schema goes to the reference decoder), never met while a record decodes. */
#define MAX_DEPTH 256
/* The work budget of a record: items of arrays and maps that take no bytes on the wire (nulls, empty records),
 * at most ZERO_SIZE_ITEMS_BASE + ZERO_SIZE_ITEMS_PER_BYTE per byte of the record (as stream/codec/plan.py). */
#define ZERO_SIZE_ITEMS_BASE 1024
#define ZERO_SIZE_ITEMS_PER_BYTE 8

typedef struct {
    int storage, var, nullable;
    char *values;           /* scalar: n items; variable: capacity items */
    unsigned char *valid;   /* nullable: n */
    unsigned char *finite;  /* float columns: n, 0 where a row holds NaN or an infinity */
    int nonfinite;
    int64_t *offsets;       /* variable: n + 1 */
    Py_ssize_t cap, at, row_start;
    int written, null;
    Buf b[4];
} Col;

/* Whether `count` reals of `width` bytes at `p` hold a NaN or an infinity (all exponent bits set). */
static inline int any_nonfinite(const char *p, Py_ssize_t count, Py_ssize_t width) {
    int bad = 0;
    if (width == 4) {
        for (Py_ssize_t j = 0; j < count; j++) {
            uint32_t bits;
            memcpy(&bits, p + 4 * j, 4);
            bad |= (bits & 0x7f800000u) == 0x7f800000u;
        }
    } else {
        for (Py_ssize_t j = 0; j < count; j++) {
            uint64_t bits;
            memcpy(&bits, p + 8 * j, 8);
            bad |= (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        }
    }
    return bad;
}

/* Bytes held by a Python object, read without the GIL: a reader default value as its column stores it (NULL: the
 * default is null), or an output constant. */
typedef struct {
    const char *bytes;
    Py_ssize_t size;
} BytesView;

/* The items of `list` (bytes; None too where `none_ok`, a view of NULL) as views to read without the GIL. *held
 * gets a tuple of the items that keeps them alive whatever happens to the list: release both with
 * release_views. NULL with an exception set when an item is of another type. */
static BytesView *bytes_views(PyObject *list, int none_ok, const char *what, PyObject **held, Py_ssize_t *count) {
    PyObject *items = PySequence_Tuple(list);
    if (items == NULL) return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(items);
    BytesView *views = PyMem_Calloc(n ? n : 1, sizeof(BytesView));
    if (views == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(items, k);
        if (item == Py_None && none_ok) continue;
        if (!PyBytes_CheckExact(item)) {
            PyErr_Format(PyExc_TypeError, "%s: bytes%s", what, none_ok ? " or None" : "");
            Py_DECREF(items);
            PyMem_Free(views);
            return NULL;
        }
        views[k].bytes = PyBytes_AS_STRING(item);
        views[k].size = PyBytes_GET_SIZE(item);
    }
    *held = items;
    *count = n;
    return views;
}

static void release_views(BytesView *views, PyObject *held) {
    PyMem_Free(views);
    Py_XDECREF(held);
}

typedef struct {
    const int32_t *prog;
    Py_ssize_t prog_len;
    const unsigned char *p, *end;
    Col *cols;
    Py_ssize_t ncols, row;
    const BytesView *defaults; /* the reader's default values (held by the caller's tuple while the GIL is released) */
    Py_ssize_t ndefaults;
    int64_t zero_items_left; /* the record's work budget (ZERO_SIZE_ITEMS_*) */
    int err;
    const char *msg;
    int32_t fail;
} Run;

static inline int rd_long(Run *r, int64_t *out) {
    uint64_t raw = 0;
    for (int k = 0; k < 10; k++) {
        if (r->p >= r->end) {
            r->err = ERR_CORRUPT;
            r->msg = "the record ends inside a varint";
            return -1;
        }
        const unsigned char byte = *r->p++;
        if (k == 9 && byte > 1) break;
        raw |= (uint64_t)(byte & 0x7F) << (7 * k);
        if (byte < 0x80) {
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    r->err = ERR_CORRUPT;
    r->msg = "a varint longer than 64 bits";
    return -1;
}

static inline int need(Run *r, Py_ssize_t n) {
    if (n < 0 || r->end - r->p < n) {
        r->err = ERR_CORRUPT;
        r->msg = "the record ends inside a value";
        return -1;
    }
    return 0;
}

/* Room for `items` more items in a variable column; ERR_ROOM (the caller grows the column) where there is none. */
static inline int room(Run *r, Col *c, Py_ssize_t items) {
    if (items > c->cap - c->at) {
        r->err = ERR_ROOM;
        r->msg = NULL;
        return -1;
    }
    return 0;
}

static inline char *slot(Run *r, Col *c) {
    if (!c->var) return c->values + r->row * st_size[c->storage];
    if (room(r, c, 1) < 0) return NULL;
    return c->values + (c->at++) * st_size[c->storage];
}

static int put_int(Run *r, int32_t col, int64_t v) {
    if (col < 0) return 0;
    Col *c = &r->cols[col];
    char *at = slot(r, c);
    if (at == NULL) return -1;
    switch (c->storage) {
    case ST_INT32: { int32_t x = (int32_t)v; memcpy(at, &x, 4); break; }
    case ST_INT64: memcpy(at, &v, 8); break;
    case ST_FLOAT32: { float x = (float)(double)v; memcpy(at, &x, 4); break; }
    case ST_FLOAT64: { double x = (double)v; memcpy(at, &x, 8); break; }
    default: r->err = ERR_INCOMPATIBLE; r->msg = "a number for a column that stores none"; return -1;
    }
    c->written = 1;
    return 0;
}

static int put_real(Run *r, int32_t col, const unsigned char *raw, int width) {
    if (col < 0) return 0;
    Col *c = &r->cols[col];
    char *at = slot(r, c);
    if (at == NULL) return -1;
    if (width == 4 && c->storage == ST_FLOAT32) memcpy(at, raw, 4);
    else if (width == 4 && c->storage == ST_FLOAT64) { float f; memcpy(&f, raw, 4); double d = f; memcpy(at, &d, 8); }
    else if (width == 8 && c->storage == ST_FLOAT64) memcpy(at, raw, 8);
    else { r->err = ERR_INCOMPATIBLE; r->msg = "a real for a column that stores none"; return -1; }
    if (c->finite != NULL && any_nonfinite((const char *)raw, 1, width)) c->nonfinite = 1;
    c->written = 1;
    return 0;
}

static int put_bytes(Run *r, int32_t col, const unsigned char *src, Py_ssize_t n) {
    if (col < 0) return 0;
    Col *c = &r->cols[col];
    if (c->storage != ST_BYTE || !c->var) { r->err = ERR_INCOMPATIBLE; r->msg = "bytes for a column of numbers"; return -1; }
    if (room(r, c, n) < 0) return -1;
    memcpy(c->values + c->at, src, n);
    c->at += n;
    c->written = 1;
    return 0;
}

/* The operation at pc; returns the pc after it, or -1 with r->err set. */
static Py_ssize_t run_op(Run *r, Py_ssize_t pc, int depth) {
    if (depth > MAX_DEPTH || pc < 0 || pc >= r->prog_len) { /* never, for a program `flatten` made */
        r->err = ERR_INCOMPATIBLE;
        r->msg = "the plan nests deeper than the C decoder goes";
        return -1;
    }
    const int32_t *prog = r->prog;
    const int32_t code = prog[pc];
    int64_t v;
    switch (code) {
    case OP_NULL: {
        const int32_t k = prog[pc + 1];
        for (int32_t j = 0; j < k; j++) {
            Col *c = &r->cols[prog[pc + 2 + j]];
            c->null = 1;
            c->written = 1;
        }
        return pc + 2 + k;
    }
    case OP_BOOLEAN: {
        if (need(r, 1) < 0) return -1;
        const unsigned char byte = *r->p++;
        if (byte > 1) { r->err = ERR_CORRUPT; r->msg = "a boolean byte that is not 0 or 1"; return -1; }
        const int32_t col = prog[pc + 1];
        if (col >= 0) {
            Col *c = &r->cols[col];
            if (c->storage != ST_BOOL) { r->err = ERR_INCOMPATIBLE; r->msg = "a boolean for a column of another type"; return -1; }
            char *at = slot(r, c);
            if (at == NULL) return -1;
            *at = (char)byte;
            c->written = 1;
        }
        return pc + 2;
    }
    case OP_INT:
    case OP_LONG:
        if (rd_long(r, &v) < 0) return -1;
        if (code == OP_INT && (v < INT32_MIN || v > INT32_MAX)) { r->err = ERR_CORRUPT; r->msg = "an int out of range"; return -1; }
        return put_int(r, prog[pc + 1], v) < 0 ? -1 : pc + 2;
    case OP_FLOAT:
    case OP_DOUBLE: {
        const int width = code == OP_FLOAT ? 4 : 8;
        if (need(r, width) < 0) return -1;
        const unsigned char *raw = r->p;
        r->p += width;
        return put_real(r, prog[pc + 1], raw, width) < 0 ? -1 : pc + 2;
    }
    case OP_BYTES:
    case OP_STRING: {
        if (rd_long(r, &v) < 0 || need(r, v) < 0) return -1;
        const unsigned char *src = r->p;
        r->p += v;
        const int32_t col = prog[pc + 1];
        const int check = code == OP_STRING || prog[pc + 2];
        if (col >= 0 && check && has_high(src, v) && !valid_utf8((const char *)src, v)) {
            r->err = ERR_CORRUPT;
            r->msg = "a string that is not UTF-8";
            return -1;
        }
        if (put_bytes(r, col, src, v) < 0) return -1;
        return pc + (code == OP_BYTES ? 3 : 2);
    }
    case OP_FIXED: {
        const int32_t size = prog[pc + 2];
        if (need(r, size) < 0) return -1;
        const unsigned char *src = r->p;
        r->p += size;
        return put_bytes(r, prog[pc + 1], src, size) < 0 ? -1 : pc + 3;
    }
    case OP_ENUM: {
        const int32_t k = prog[pc + 2];
        if (rd_long(r, &v) < 0) return -1;
        if (v < 0 || v >= k) { r->err = ERR_CORRUPT; r->msg = "an enum index out of range"; return -1; }
        const int32_t code_ = prog[pc + 3 + v];
        if (code_ < 0) { r->err = ERR_INCOMPATIBLE; r->msg = "an enum symbol the reader does not have (and no default)"; return -1; }
        return put_int(r, prog[pc + 1], code_) < 0 ? -1 : pc + 3 + k;
    }
    case OP_ARRAY:
    case OP_MAP: {
        const int arr = code == OP_ARRAY;
        const int32_t minsize = prog[pc + (arr ? 2 : 1)], len = prog[pc + (arr ? 3 : 2)];
        const Py_ssize_t item = pc + (arr ? 4 : 3);
        if (arr && prog[pc + 1] >= 0) r->cols[prog[pc + 1]].written = 1;
        for (;;) {
            int64_t count;
            if (rd_long(r, &count) < 0) return -1;
            if (count == 0) break;
            if (count < 0) {
                int64_t size;
                if (count == INT64_MIN) { r->err = ERR_CORRUPT; r->msg = "a block count out of range"; return -1; }
                count = -count;
                if (rd_long(r, &size) < 0) return -1;
            }
            if (minsize > 0 && count > (r->end - r->p) / minsize) {
                r->err = ERR_CORRUPT;
                r->msg = "a block count larger than the record";
                return -1;
            }
            if (minsize == 0) {
                if (count > r->zero_items_left) {
                    r->err = ERR_BUDGET;
                    r->msg = "more items that take no bytes than the record's work budget (1024 + 8 a byte)";
                    return -1;
                }
                r->zero_items_left -= count;
            }
            const int32_t icode = r->prog[item];
            if (arr && (icode == OP_FLOAT || icode == OP_DOUBLE)) { /* a block of reals: one copy, no dispatch */
                const int width = icode == OP_FLOAT ? 4 : 8;
                if (need(r, count * width) < 0) return -1;
                const int32_t col = r->prog[item + 1];
                if (col >= 0) {
                    Col *c = &r->cols[col];
                    if (room(r, c, count) < 0) return -1;
                    if (st_size[c->storage] == width && c->storage != ST_INT64) {
                        memcpy(c->values + c->at * width, r->p, count * width);
                        c->at += count;
                        if (c->finite != NULL && any_nonfinite((const char *)r->p, count, width)) c->nonfinite = 1;
                    } else {
                        for (int64_t j = 0; j < count; j++)
                            if (put_real(r, col, r->p + j * width, width) < 0) return -1;
                    }
                    c->written = 1;
                }
                r->p += count * width;
                continue;
            }
            for (int64_t j = 0; j < count; j++) {
                if (!arr) {
                    int64_t key;
                    if (rd_long(r, &key) < 0 || need(r, key) < 0) return -1;
                    r->p += key;
                }
                if (run_op(r, item, depth + 1) < 0) return -1;
            }
        }
        return item + len;
    }
    case OP_UNION: {
        const int32_t k = prog[pc + 1];
        if (rd_long(r, &v) < 0) return -1;
        if (v < 0 || v >= k) { r->err = ERR_CORRUPT; r->msg = "a union branch out of range"; return -1; }
        Py_ssize_t at = pc + 2, end = -1;
        for (int32_t j = 0; j < k; j++) {
            const int32_t len = prog[at];
            if (j == v && run_op(r, at + 1, depth + 1) < 0) return -1;
            at += 1 + len;
        }
        end = at;
        return end;
    }
    case OP_RECORD: {
        const int32_t k = prog[pc + 1];
        Py_ssize_t at = pc + 2;
        for (int32_t j = 0; j < k; j++) {
            at = run_op(r, at, depth + 1);
            if (at < 0) return -1;
        }
        const int32_t d = prog[at];
        for (int32_t j = 0; j < d; j++) {
            const int32_t col = prog[at + 1 + 2 * j], which = prog[at + 2 + 2 * j];
            Col *c = &r->cols[col];
            if (which < 0 || which >= r->ndefaults) {
                r->err = ERR_CORRUPT;
                r->msg = "a default out of the plan's defaults";
                return -1;
            }
            const BytesView *value = &r->defaults[which];
            c->written = 1;
            if (value->bytes == NULL) {
                c->null = 1;
                continue;
            }
            const Py_ssize_t n = value->size;
            const char *src = value->bytes;
            if (c->var ? n % st_size[c->storage] != 0 : n != st_size[c->storage]) { /* `flatten` makes none */
                r->err = ERR_INCOMPATIBLE;
                r->msg = "a reader default of another size than its column's values";
                return -1;
            }
            if (c->var) {
                if (room(r, c, n / st_size[c->storage]) < 0) return -1;
                memcpy(c->values + c->at * st_size[c->storage], src, n);
                c->at += n / st_size[c->storage];
            } else
                memcpy(c->values + r->row * st_size[c->storage], src, st_size[c->storage]);
            if (c->finite != NULL && any_nonfinite(src, n / st_size[c->storage], st_size[c->storage]))
                c->nonfinite = 1;
        }
        return at + 1 + 2 * d;
    }
    case OP_FAIL:
        r->err = ERR_INCOMPATIBLE;
        r->fail = prog[pc + 1];
        r->msg = NULL;
        return -1;
    default:
        r->err = ERR_CORRUPT;
        r->msg = "unknown operation in the plan";
        return -1;
    }
}

/* Checks the operation at pc of a program against the columns and defaults it will write, as run_op will walk it
 * (lengths, indices, nesting); returns the pc after it, or -1 with a ValueError set. Every program is checked once
 * per call before a record is read: the module is importable, and a program is not trusted because `flatten`
 * makes the right ones. */
static Py_ssize_t check_op(const int32_t *prog, Py_ssize_t len, Py_ssize_t pc, Py_ssize_t ncols,
                           Py_ssize_t ndefaults, int depth) {
#define NEED(cond, what)                                                                            \
    if (!(cond)) {                                                                                  \
        PyErr_Format(PyExc_ValueError, "field program: %s at %zd", what, pc);                       \
        return -1;                                                                                  \
    }
#define COL(c) ((c) >= -1 && (c) < ncols)
    NEED(depth <= MAX_DEPTH, "nested deeper than MAX_DEPTH");
    NEED(pc >= 0 && pc < len, "an operation past the end");
    const int32_t code = prog[pc];
    switch (code) {
    case OP_NULL: {
        NEED(pc + 2 <= len && prog[pc + 1] >= 0 && prog[pc + 1] <= len - pc - 2, "a cut NULL");
        for (int32_t j = 0; j < prog[pc + 1]; j++) NEED(prog[pc + 2 + j] >= 0 && prog[pc + 2 + j] < ncols, "a column");
        return pc + 2 + prog[pc + 1];
    }
    case OP_BOOLEAN: case OP_INT: case OP_LONG: case OP_FLOAT: case OP_DOUBLE: case OP_STRING:
        NEED(pc + 2 <= len, "an operation cut short");
        NEED(COL(prog[pc + 1]), "a column");
        return pc + 2;
    case OP_BYTES:
    case OP_FIXED:
        NEED(pc + 3 <= len && COL(prog[pc + 1]) && prog[pc + 2] >= 0, "a cut BYTES or FIXED");
        return pc + 3;
    case OP_ENUM:
        NEED(pc + 3 <= len && COL(prog[pc + 1]) && prog[pc + 2] >= 0 && prog[pc + 2] <= len - pc - 3, "a cut ENUM");
        return pc + 3 + prog[pc + 2];
    case OP_ARRAY:
    case OP_MAP: {
        const int arr = code == OP_ARRAY;
        const Py_ssize_t item = pc + (arr ? 4 : 3);
        NEED(item <= len && (!arr || COL(prog[pc + 1])), "a cut ARRAY or MAP");
        const int32_t minsize = prog[pc + (arr ? 2 : 1)], body = prog[pc + (arr ? 3 : 2)];
        NEED(minsize >= 0 && body > 0 && body <= len - item, "an item length");
        const Py_ssize_t end = check_op(prog, len, item, ncols, ndefaults, depth + 1);
        if (end < 0) return -1;
        NEED(end == item + body, "an item op of another length");
        return end;
    }
    case OP_UNION: {
        NEED(pc + 2 <= len && prog[pc + 1] >= 0, "a cut UNION");
        Py_ssize_t at = pc + 2;
        for (int32_t j = 0; j < prog[pc + 1]; j++) {
            NEED(at < len && prog[at] > 0 && prog[at] <= len - at - 1, "a branch length");
            const Py_ssize_t end = check_op(prog, len, at + 1, ncols, ndefaults, depth + 1);
            if (end < 0) return -1;
            NEED(end == at + 1 + prog[at], "a branch op of another length");
            at = end;
        }
        return at;
    }
    case OP_RECORD: {
        NEED(pc + 2 <= len && prog[pc + 1] >= 0, "a cut RECORD");
        Py_ssize_t at = pc + 2;
        for (int32_t j = 0; j < prog[pc + 1]; j++) {
            at = check_op(prog, len, at, ncols, ndefaults, depth + 1);
            if (at < 0) return -1;
        }
        NEED(at < len && prog[at] >= 0 && prog[at] <= (len - at - 1) / 2, "cut defaults");
        for (int32_t j = 0; j < prog[at]; j++) {
            const int32_t col = prog[at + 1 + 2 * j], which = prog[at + 2 + 2 * j];
            NEED(col >= 0 && col < ncols && which >= 0 && which < ndefaults, "a default's column or value");
        }
        return at + 1 + 2 * prog[at];
    }
    case OP_FAIL:
        NEED(pc + 2 <= len && prog[pc + 1] >= 0, "a cut FAIL");
        return pc + 2;
    default:
        NEED(0, "an unknown operation");
    }
#undef COL
#undef NEED
}

/* A record not taken, kept in C while the GIL is released: turned into Python objects afterwards. */
typedef struct {
    int64_t raw;
    int err;
    const char *msg; /* a static message, or NULL: `fail` indexes the plan's reasons */
    int32_t fail;
} RowError;

/* run_plan(program, defaults, values, rows, skip, columns, index) -> (taken, errors, short)
 *
 * values: as for scan_events (a list of bytes, or (buffer, starts, lengths)); rows: int64 positions of the
 * records to decode, each read from byte `skip` (past its header). columns: a list of (storage, var, nullable,
 * values, valid, offsets, finite) with values of `len(rows)` items (scalar) or of capacity items (variable),
 * valid uint8 (nullable), offsets int64 (len(rows) + 1, variable), finite uint8 (or None; columns of reals:
 * whether the row's values are all finite, checked as they are copied). index (int64, len(rows)) receives each
 * taken row's raw position. errors: [(raw position, reason, message or fail index)] for the records not taken,
 * reason 1 corrupt-avro, 2 incompatible-schema, 3 over-budget. short: 1 when a variable column had no room for a
 * record (its reader defaults, or many items that take no bytes, can outgrow the bytes it was sized by): then
 * nothing returned is to be used, and the caller runs the batch again with more. The rows are decoded without
 * the GIL when the values are the
 * joined form. */
static PyObject *run_plan(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *prog_obj, *defaults_obj, *values, *rows_obj, *cols_obj, *index_obj;
    Py_ssize_t skip;
    if (!PyArg_ParseTuple(args, "OO!OOnO!O", &prog_obj, &PyList_Type, &defaults_obj, &values, &rows_obj, &skip,
                          &PyList_Type, &cols_obj, &index_obj))
        return NULL;
    PyObject *defaults = NULL; /* keeps the defaults alive while the GIL is released */
    Py_ssize_t ndefaults = 0;
    BytesView *dflt = bytes_views(defaults_obj, 1, "defaults", &defaults, &ndefaults);
    if (dflt == NULL) return NULL;
    PyObject *result = NULL, *errors = NULL;
    RowError *failed = NULL;
    Buf in[3];
    memset(in, 0, sizeof in);
    Values v;
    memset(&v, 0, sizeof v);
    const Py_ssize_t ncols = PyList_GET_SIZE(cols_obj);
    Col *cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Col));
    if (cols == NULL) {
        release_views(dflt, defaults);
        return PyErr_NoMemory();
    }
    if (skip < 0) {
        PyErr_SetString(PyExc_ValueError, "skip: 0 or more");
        goto done;
    }
    if (get_buf(prog_obj, &in[0], 4, 0, 0, "program") < 0 || get_buf(rows_obj, &in[1], 8, 0, 0, "rows") < 0)
        goto done;
    {
        const Py_ssize_t prog_len = in[0].view.len / 4;
        const Py_ssize_t end = check_op(in[0].view.buf, prog_len, 0, ncols, ndefaults, 0);
        if (end < 0) goto done;
        if (end != prog_len) {
            PyErr_SetString(PyExc_ValueError, "field program: operations after the root");
            goto done;
        }
    }
    const Py_ssize_t n = in[1].view.len / 8;
    if (get_buf(index_obj, &in[2], 8, n, 1, "index") < 0 || values_open(values, &v) < 0) goto done;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        PyObject *spec = PyList_GET_ITEM(cols_obj, k), *vo, *valido, *offo, *fino;
        Col *c = &cols[k];
        if (!PyArg_ParseTuple(spec, "iiiOOOO", &c->storage, &c->var, &c->nullable, &vo, &valido, &offo, &fino))
            goto cols_done;
        if (c->storage < 0 || c->storage > ST_BYTE) { PyErr_SetString(PyExc_ValueError, "storage"); goto cols_done; }
        if (get_buf(vo, &c->b[0], st_size[c->storage], c->var ? 0 : n, 1, "column values") < 0) goto cols_done;
        c->values = c->b[0].view.buf;
        c->cap = c->b[0].view.len / st_size[c->storage];
        if (c->nullable) {
            if (get_buf(valido, &c->b[1], 1, n, 1, "column valid") < 0) goto cols_done;
            c->valid = c->b[1].view.buf;
        }
        if (fino != Py_None) {
            if (c->storage != ST_FLOAT32 && c->storage != ST_FLOAT64) {
                PyErr_SetString(PyExc_ValueError, "finite: only for columns of reals");
                goto cols_done;
            }
            if (get_buf(fino, &c->b[3], 1, n, 1, "column finite") < 0) goto cols_done;
            c->finite = c->b[3].view.buf;
        }
        if (c->var) {
            if (get_buf(offo, &c->b[2], 8, n + 1, 1, "column offsets") < 0) goto cols_done;
            c->offsets = c->b[2].view.buf;
            c->offsets[0] = 0;
        }
    }
    Run r = {.prog = in[0].view.buf, .prog_len = in[0].view.len / 4, .cols = cols, .ncols = ncols,
             .defaults = dflt, .ndefaults = ndefaults};
    const int64_t *rows = in[1].view.buf;
    int64_t *index = in[2].view.buf;
    Py_ssize_t taken = 0, nfailed = 0, cap_failed = 0, missing = -1;
    int no_memory = 0, short_of_room = 0;
    /* The records as one joined buffer (the worker's input) are decoded without the GIL, so that other threads
     * (the next batch's prepare, the finish stage's encode) run meanwhile; a list of bytes objects keeps it. */
    PyThreadState *released = v.list == NULL ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t raw = rows[i];
        Py_ssize_t len = -1;
        const unsigned char *p = raw >= 0 && raw < v.count ? value_at(&v, (Py_ssize_t)raw, &len) : NULL;
        if (p == NULL || len < skip) {
            missing = i;
            break;
        }
        r.p = p + skip;
        r.end = p + len;
        r.row = taken;
        r.err = ERR_NONE;
        r.msg = NULL;
        r.zero_items_left = ZERO_SIZE_ITEMS_BASE + ZERO_SIZE_ITEMS_PER_BYTE * (int64_t)(len - skip);
        for (Py_ssize_t k = 0; k < ncols; k++) {
            cols[k].written = cols[k].null = cols[k].nonfinite = 0;
            cols[k].row_start = cols[k].at;
        }
        if (run_op(&r, 0, 0) >= 0 && r.p != r.end) {
            r.err = ERR_CORRUPT;
            r.msg = "trailing bytes after the record";
        }
        for (Py_ssize_t k = 0; k < ncols && r.err == ERR_NONE; k++) {
            Col *c = &cols[k];
            if (!c->written) c->null = 1;
            if (c->null && !c->nullable) {
                r.err = ERR_INCOMPATIBLE;
                r.msg = "a null where the reader needs a value";
            }
        }
        if (r.err == ERR_ROOM) {
            short_of_room = 1;
            break;
        }
        if (r.err != ERR_NONE) {
            for (Py_ssize_t k = 0; k < ncols; k++) cols[k].at = cols[k].row_start;
            if (nfailed == cap_failed) {
                cap_failed = cap_failed ? 2 * cap_failed : 16;
                RowError *grown = PyMem_RawRealloc(failed, cap_failed * sizeof(RowError));
                if (grown == NULL) {
                    no_memory = 1;
                    break;
                }
                failed = grown;
            }
            failed[nfailed++] = (RowError){.raw = raw, .err = r.err, .msg = r.msg, .fail = r.fail};
            continue;
        }
        for (Py_ssize_t k = 0; k < ncols; k++) {
            Col *c = &cols[k];
            if (c->var) {
                if (c->null) c->at = c->row_start;
                c->offsets[taken + 1] = c->at;
            } else if (c->null)
                memset(c->values + taken * st_size[c->storage], 0, st_size[c->storage]);
            if (c->nullable) c->valid[taken] = !c->null;
            if (c->finite != NULL) c->finite[taken] = c->null || !c->nonfinite;
        }
        index[taken++] = raw;
    }
    if (released != NULL) PyEval_RestoreThread(released);
    if (no_memory) {
        PyErr_NoMemory();
        goto cols_done;
    }
    if (missing >= 0) {
        PyErr_Format(PyExc_ValueError, "row %zd: no value of at least %zd bytes at position %lld", missing, skip,
                     (long long)rows[missing]);
        goto cols_done;
    }
    errors = PyList_New(nfailed);
    if (errors == NULL) goto cols_done;
    for (Py_ssize_t e = 0; e < nfailed; e++) {
        const RowError *f = &failed[e];
        PyObject *what = f->msg != NULL ? PyUnicode_FromString(f->msg) : PyLong_FromLong(f->fail);
        PyObject *item = what == NULL ? NULL : Py_BuildValue("(LiN)", (long long)f->raw, f->err, what);
        if (item == NULL) goto cols_done;
        PyList_SET_ITEM(errors, e, item);
    }
    result = Py_BuildValue("(nOi)", taken, errors, short_of_room);
cols_done:
    for (Py_ssize_t k = 0; k < ncols; k++) release(cols[k].b, 4);
done:
    Py_XDECREF(errors);
    release(v.b, 3);
    release(in, 3);
    PyMem_Free(cols);
    release_views(dflt, defaults);
    PyMem_RawFree(failed);
    return result;
}

/* read_ids(values, ids) -> None: ids[i] (int64) = the schema id in value i's 5-byte header (magic byte 0, then a
 * big-endian uint32), -1 for None, -2 for a value shorter than the header, -3 for another magic byte. */
static PyObject *read_ids(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *values, *ids_obj;
    if (!PyArg_ParseTuple(args, "OO", &values, &ids_obj)) return NULL;
    Values v;
    Buf out;
    memset(&out, 0, sizeof out);
    PyObject *result = NULL;
    if (values_open(values, &v) < 0 || get_buf(ids_obj, &out, 8, v.count, 1, "ids") < 0) goto done;
    int64_t *ids = out.view.buf;
    for (Py_ssize_t i = 0; i < v.count; i++) {
        Py_ssize_t len = -1;
        const unsigned char *p = value_at(&v, i, &len);
        if (p == NULL) ids[i] = -1;
        else if (len < 5) ids[i] = -2;
        else if (p[0] != 0) ids[i] = -3;
        else ids[i] = ((int64_t)p[1] << 24) | ((int64_t)p[2] << 16) | ((int64_t)p[3] << 8) | (int64_t)p[4];
    }
    result = Py_None;
    Py_INCREF(result);
done:
    release(v.b, 3);
    release(&out, 1);
    return result;
}

/* ---- output plans: one Avro record per row, from columns ------------------------------------------------------
 *
 * encode_rows(header, program, consts, arrays, n, ends) -> bytes runs an output plan (built by
 * stream.codec.encoder.OutputEncoder) for rows 0..n-1: each row is the header, then each field of the output
 * schema in order, written by one operation:
 *   CONST k              consts[k], the same encoded bytes in every row (model name, a default, ...)
 *   LONG a | INT a       arrays[a]: int64 / int32 values, as zigzag varints
 *   FLOAT a | DOUBLE a   arrays[a]: float32 / float64 values, little-endian
 *   BOOL a               arrays[a]: uint8
 *   BYTES a o            arrays[a]: uint8 data, arrays[o]: int64 offsets (n + 1): length varint, then the bytes
 *   REALS a o width      a block of reals (array<float|double>): count, the raw values, 0 (just 0 when empty)
 *   LONGS a o | INTS a o a block of varints (array<long|int>)
 *   NULLABLE v null idx len   arrays[v]: uint8 per row; 0: the union branch `null` and the next op (len ints) is
 *                        skipped, else branch `idx`, then the next op
 * ends[i] receives row i's end offset in the result. The arrays are checked once against the program; the
 * output is sized from a bound computed per operation (not per row), written in one pass, then cut to size. */

enum { EN_CONST, EN_LONG, EN_INT, EN_FLOAT, EN_DOUBLE, EN_BOOL, EN_BYTES, EN_REALS, EN_LONGS, EN_INTS, EN_NULLABLE };

static int en_args(int32_t code) {
    switch (code) {
    case EN_REALS: return 3;
    case EN_NULLABLE: return 4;
    case EN_BYTES: case EN_LONGS: case EN_INTS: return 2;
    default: return 1;
    }
}

static PyObject *encode_rows(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *header_obj, *prog_obj, *consts_obj, *arrays_obj, *ends_obj;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "SOO!O!nO", &header_obj, &prog_obj, &PyList_Type, &consts_obj, &PyList_Type,
                          &arrays_obj, &n, &ends_obj))
        return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "n: 0 or more rows, not %zd", n);
    PyObject *consts = NULL; /* the rows are written without the GIL: the constants as views, kept alive by it */
    Py_ssize_t nconsts = 0;
    BytesView *constant = bytes_views(consts_obj, 0, "consts", &consts, &nconsts);
    if (constant == NULL) return NULL;
    const Py_ssize_t narrays = PyList_GET_SIZE(arrays_obj);
    Buf *arrays = PyMem_Calloc(narrays ? narrays : 1, sizeof(Buf));
    Buf pb, eb;
    memset(&pb, 0, sizeof pb);
    memset(&eb, 0, sizeof eb);
    PyObject *result = NULL;
    if (arrays == NULL) {
        release_views(constant, consts);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < narrays; k++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(arrays_obj, k), &arrays[k].view, PyBUF_C_CONTIGUOUS) < 0) goto done;
        arrays[k].held = 1;
    }
    if (get_buf(prog_obj, &pb, 4, 0, 0, "program") < 0 || get_buf(ends_obj, &eb, 8, n, 1, "ends") < 0) goto done;
    const int32_t *prog = pb.view.buf;
    const Py_ssize_t len = pb.view.len / 4;
    const Py_ssize_t header_size = PyBytes_GET_SIZE(header_obj);
    /* Check every operation against its arrays, and bound the output: per operation, not per row. */
    Py_ssize_t bound = n * header_size;
    for (Py_ssize_t pc = 0; pc < len;) {
        const int32_t code = prog[pc];
        if (code < EN_CONST || code > EN_NULLABLE || pc + en_args(code) >= len) {
            PyErr_SetString(PyExc_ValueError, "output program: an unknown operation or one cut short");
            goto done;
        }
        const int32_t x = prog[pc + 1];
        if (code == EN_CONST) {
            if (x < 0 || x >= nconsts) { PyErr_SetString(PyExc_ValueError, "const index"); goto done; }
            bound += n * constant[x].size;
        } else if (x < 0 || x >= narrays) {
            PyErr_SetString(PyExc_ValueError, "array index");
            goto done;
        } else if (code == EN_BYTES || code == EN_REALS || code == EN_LONGS || code == EN_INTS) {
            const int32_t o = prog[pc + 2];
            if (o < 0 || o >= narrays || arrays[o].view.len < 8 * (n + 1)) {
                PyErr_SetString(PyExc_ValueError, "offsets: need n + 1 int64");
                goto done;
            }
            const int64_t *off = arrays[o].view.buf;
            const Py_ssize_t width = code == EN_BYTES ? 1 : code == EN_REALS ? prog[pc + 3] : code == EN_LONGS ? 8 : 4;
            if ((code == EN_REALS && width != 4 && width != 8) || off[0] < 0 || off[n] < off[0] ||
                arrays[x].view.len < off[n] * width) {
                PyErr_SetString(PyExc_ValueError, "offsets out of their data");
                goto done;
            }
            for (Py_ssize_t i = 0; i < n; i++)
                if (off[i + 1] < off[i]) {
                    PyErr_Format(PyExc_ValueError, "row %zd: offsets decrease", i);
                    goto done;
                }
            const Py_ssize_t items = (Py_ssize_t)(off[n] - off[0]);
            bound += n * 11 + (code == EN_BYTES || code == EN_REALS ? items * width : items * 10);
        } else {
            const Py_ssize_t width = code == EN_LONG ? 8 : code == EN_INT ? 4 : code == EN_FLOAT ? 4
                                     : code == EN_DOUBLE ? 8 : 1;
            if (arrays[x].view.len < n * width) {
                PyErr_Format(PyExc_ValueError, "array %d holds fewer than %zd rows", (int)x, n);
                goto done;
            }
            bound += n * (code == EN_LONG || code == EN_INT ? 10 : code == EN_NULLABLE ? 10 : width);
            /* The value op that a null skips: exactly the next operation, which is no NULLABLE itself. */
            if (code == EN_NULLABLE && (pc + 5 >= len || prog[pc + 5] < EN_CONST || prog[pc + 5] >= EN_NULLABLE ||
                                        prog[pc + 4] != 1 + en_args(prog[pc + 5]) || pc + 5 + prog[pc + 4] > len)) {
                PyErr_SetString(PyExc_ValueError, "output program: a nullable field's value op is not the next one");
                goto done;
            }
        }
        pc += 1 + en_args(code);
    }
    result = PyBytes_FromStringAndSize(NULL, bound);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    const char *header = PyBytes_AS_STRING(header_obj);
    int64_t *ends = eb.view.buf;
    Py_ssize_t at = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(out + at, header, header_size);
        at += header_size;
        for (Py_ssize_t pc = 0; pc < len;) {
            const int32_t code = prog[pc];
            const Buf *a = code == EN_CONST ? NULL : &arrays[prog[pc + 1]]; /* EN_CONST's argument is a const */
            switch (code) {
            case EN_CONST: {
                const BytesView *c = &constant[prog[pc + 1]];
                memcpy(out + at, c->bytes, c->size);
                at += c->size;
                pc += 2;
                break;
            }
            case EN_LONG: at += put_long(out + at, ((const int64_t *)a->view.buf)[i]); pc += 2; break;
            case EN_INT: at += put_long(out + at, ((const int32_t *)a->view.buf)[i]); pc += 2; break;
            case EN_FLOAT: memcpy(out + at, (const char *)a->view.buf + 4 * i, 4); at += 4; pc += 2; break;
            case EN_DOUBLE: memcpy(out + at, (const char *)a->view.buf + 8 * i, 8); at += 8; pc += 2; break;
            case EN_BOOL: out[at++] = ((const unsigned char *)a->view.buf)[i] ? 1 : 0; pc += 2; break;
            case EN_BYTES:
            case EN_REALS:
            case EN_LONGS:
            case EN_INTS: {
                const int64_t *o = arrays[prog[pc + 2]].view.buf;
                const Py_ssize_t count = (Py_ssize_t)(o[i + 1] - o[i]);
                const Py_ssize_t width = code == EN_BYTES ? 1 : code == EN_REALS ? prog[pc + 3]
                                         : code == EN_LONGS ? 8 : 4;
                const char *src = (const char *)a->view.buf + o[i] * width;
                at += put_long(out + at, count);
                if (code == EN_BYTES || code == EN_REALS) {
                    memcpy(out + at, src, count * width);
                    at += count * width;
                } else
                    for (Py_ssize_t j = 0; j < count; j++)
                        at += put_long(out + at, code == EN_LONGS ? ((const int64_t *)src)[j]
                                                                  : ((const int32_t *)src)[j]);
                if (code != EN_BYTES && count > 0) out[at++] = 0; /* the block that ends the array */
                pc += code == EN_REALS ? 4 : 3;
                break;
            }
            case EN_NULLABLE:
                if (((const unsigned char *)a->view.buf)[i]) {
                    at += put_long(out + at, prog[pc + 3]);
                    pc += 5; /* on to the value's op */
                } else {
                    at += put_long(out + at, prog[pc + 2]);
                    pc += 5 + prog[pc + 4]; /* past the value's op */
                }
                break;
            }
        }
        ends[i] = at;
    }
    Py_END_ALLOW_THREADS
    if (at > bound) { /* cannot happen: the bound holds each operation's largest encoding */
        Py_CLEAR(result);
        PyErr_SetString(PyExc_SystemError, "encode_rows wrote past its bound");
        goto done;
    }
    _PyBytes_Resize(&result, at);
done:
    release(&pb, 1);
    release(&eb, 1);
    release(arrays, (int)narrays);
    PyMem_Free(arrays);
    release_views(constant, consts);
    return result;
}

static PyMethodDef methods[] = {
    {"run_plan", run_plan, METH_VARARGS, "Run a field plan over a batch into columns: see the C source."},
    {"read_ids", read_ids, METH_VARARGS, "The schema id of each value's header: see the C source."},
    {"encode_rows", encode_rows, METH_VARARGS, "Run an output plan over a batch of columns: see the C source."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "stream.codec._nativecodec", NULL, -1, methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nativecodec(void) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "stream.codec._nativecodec: big-endian host (Avro floats are little-endian)");
        return NULL;
    }
    PyObject *module = PyModule_Create(&moduledef);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "MAX_DEPTH", MAX_DEPTH) < 0 ||
        PyModule_AddIntConstant(module, "ZERO_SIZE_ITEMS_BASE", ZERO_SIZE_ITEMS_BASE) < 0 ||
        PyModule_AddIntConstant(module, "ZERO_SIZE_ITEMS_PER_BYTE", ZERO_SIZE_ITEMS_PER_BYTE) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
