/* The Avro fast paths of stream/codec.py in C: the input-event scan and the prediction encoder.
 *
 * Both do exactly what their numpy versions in codec.py do (EventDecoder._scan_numpy and the numpy part of
 * PredictionEncoder._encode_fast), which stay as the fallback where this extension is not compiled and as the
 * reference the tests compare against. The numpy versions build a dozen temporary arrays per batch, several of
 * them 8 bytes per byte of payload; here each record is read or written once, in one pass.
 *
 * No numpy headers: arrays come in as writable buffers (the buffer protocol), allocated by the caller with the
 * right dtype and length, which is checked here. Floats are copied as they are on the wire (little-endian);
 * the module refuses to load on a big-endian host.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TS_BYTES 9 /* the scan reads timestamps of up to 63 bits (9 varint bytes); longer ones go to fastavro */

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

/* Strict UTF-8 check of the bytes, as Python's decoder does it (only called when a byte is >= 0x80). */
static int valid_utf8(const char *s, Py_ssize_t n) {
    PyObject *text = PyUnicode_DecodeUTF8(s, n, "strict");
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(text);
    return 1;
}

static int has_high(const unsigned char *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] & 0x80) return 1;
    return 0;
}

/* scan_events(values, header, n_features, max_bytes, index, id_buf, id_start, id_len, ts, features) -> rows
 *
 * values: a list of bytes (or None), or (buffer, starts, lengths) for values back to back in one buffer (int64
 * starts and lengths, length -1 for None). Takes each value that has the registered event layout: the schema
 * header, an event_id and a key shorter than 64 bytes (one-byte lengths) in valid UTF-8, a ts_ms varint of at most 9 bytes, then one block
 * of exactly n_features floats and the 0 that ends the array, and nothing after. For the r-th taken value
 * (raw position i): index[r] = i, its event_id as Avro wrote it (length byte, then UTF-8) is appended to
 * id_buf (at id_start[r], id_len[r] bytes), ts[r] its ts_ms, features[r] its floats. Anything else (None, a
 * different layout, longer than max_bytes when max_bytes >= 0) is left for fastavro. Outputs: index, id_start,
 * id_len and ts int64 (n), id_buf uint8 (64 n), features float32 (n * n_features). */
static PyObject *scan_events(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *values, *header_obj, *outs[6], *joined_buf = NULL, *joined_starts = NULL, *joined_lens = NULL;
    Py_ssize_t n_features, max_bytes;
    if (!PyArg_ParseTuple(args, "OSnnOOOOOO", &values, &header_obj, &n_features, &max_bytes,
                          &outs[0], &outs[1], &outs[2], &outs[3], &outs[4], &outs[5]))
        return NULL;
    if (n_features <= 0 || n_features >= 64) {
        PyErr_SetString(PyExc_ValueError, "n_features must be 1..63 (a one-byte item count)");
        return NULL;
    }
    /* values: a list of bytes (or None), or (buffer, starts, lengths): every value back to back in one buffer,
     * with int64 starts and lengths (-1: None). */
    int joined = !PyList_Check(values);
    Buf in[3];
    memset(in, 0, sizeof in);
    Py_ssize_t n;
    if (joined) {
        if (!PyArg_ParseTuple(values, "OOO", &joined_buf, &joined_starts, &joined_lens))
            return NULL;
        if (PyObject_GetBuffer(joined_buf, &in[0].view, PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        in[0].held = 1;
        if (get_buf(joined_lens, &in[2], 8, 0, 0, "lengths") < 0) {
            release(in, 3);
            return NULL;
        }
        n = in[2].view.len / 8;
        if (get_buf(joined_starts, &in[1], 8, n, 0, "starts") < 0) {
            release(in, 3);
            return NULL;
        }
    } else
        n = PyList_GET_SIZE(values);
    const unsigned char *jbuf = in[0].view.buf;
    const int64_t *jstart = in[1].view.buf, *jlen = in[2].view.buf;
    const Py_ssize_t jsize = in[0].view.len;
    Buf b[6];
    memset(b, 0, sizeof b);
    static const char *names[] = {"index", "id_buf", "id_start", "id_len", "ts", "features"};
    const Py_ssize_t sizes[] = {8, 1, 8, 8, 8, 4};
    const Py_ssize_t counts[] = {n, 64 * n, n, n, n, n * n_features};
    for (int k = 0; k < 6; k++)
        if (get_buf(outs[k], &b[k], sizes[k], counts[k], 1, names[k]) < 0) {
            release(b, 6);
            release(in, 3);
            return NULL;
        }
    int64_t *index = b[0].view.buf, *id_start = b[2].view.buf, *id_len = b[3].view.buf, *ts = b[4].view.buf;
    unsigned char *id_buf = b[1].view.buf;
    char *features = b[5].view.buf;
    const unsigned char *header = (const unsigned char *)PyBytes_AS_STRING(header_obj);
    const Py_ssize_t header_size = PyBytes_GET_SIZE(header_obj);
    const Py_ssize_t width = 4 * n_features;
    const unsigned char count_byte = (unsigned char)(2 * n_features);
    Py_ssize_t rows = 0, id_at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *p;
        Py_ssize_t len;
        if (joined) {
            if (jlen[i] < 0 || jstart[i] < 0 || jstart[i] + jlen[i] > jsize) continue;
            p = jbuf + jstart[i];
            len = (Py_ssize_t)jlen[i];
        } else {
            PyObject *v = PyList_GET_ITEM(values, i);
            if (!PyBytes_CheckExact(v)) continue;
            p = (const unsigned char *)PyBytes_AS_STRING(v);
            len = PyBytes_GET_SIZE(v);
        }
        if (len < header_size + 5 + width || (max_bytes >= 0 && len > max_bytes)) continue;
        if (memcmp(p, header, header_size) != 0) continue;
        const Py_ssize_t id_pos = header_size;
        const unsigned char id_byte = p[id_pos];
        if (id_byte & 0x81) continue;
        const Py_ssize_t key_pos = id_pos + 1 + (id_byte >> 1);
        if (key_pos >= len) continue;
        const unsigned char key_byte = p[key_pos];
        if (key_byte & 0x81) continue;
        const Py_ssize_t ts_pos = key_pos + 1 + (key_byte >> 1);
        uint64_t raw = 0;
        Py_ssize_t ts_len = 0;
        for (int k = 0; k < TS_BYTES && ts_pos + k < len; k++) {
            raw |= (uint64_t)(p[ts_pos + k] & 0x7F) << (7 * k);
            if (p[ts_pos + k] < 0x80) {
                ts_len = k + 1;
                break;
            }
        }
        if (ts_len == 0) continue;
        const Py_ssize_t count_pos = ts_pos + ts_len;
        if (count_pos + 2 + width != len || p[count_pos] != count_byte || p[count_pos + 1 + width] != 0) continue;
        if (has_high(p + id_pos + 1, ts_pos - id_pos - 1) &&
            !(valid_utf8((const char *)p + id_pos + 1, key_pos - id_pos - 1) &&
              valid_utf8((const char *)p + key_pos + 1, ts_pos - key_pos - 1)))
            continue;
        index[rows] = i;
        id_start[rows] = id_at;
        id_len[rows] = key_pos - id_pos;
        memcpy(id_buf + id_at, p + id_pos, key_pos - id_pos);
        id_at += key_pos - id_pos;
        ts[rows] = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        memcpy(features + rows * width, p + count_pos + 1, width);
        rows++;
    }
    release(b, 6);
    release(in, 3);
    return PyLong_FromSsize_t(rows);
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

/* encode_predictions(header, id_buf, id_start, id_len, models, scores, flags, event_ts, tail, partitions,
 *                    offsets, ends) -> bytes
 *
 * One prediction per row, back to back: header | event_id field (id_buf[id_start:id_start+id_len], as read) |
 * models (model name and version, encoded) | score (float32) | flag (one byte) | event ts (long) | tail (the
 * batch's constant fields, encoded) | and, when partitions is not None, partition (int) and offset (long).
 * ends[i] receives row i's end offset in the result. Inputs: id_start, id_len, event_ts, offsets int64 (n);
 * partitions int32 (n); scores float32 (n); flags bool/uint8 (n); ends int64 (n), written. */
static PyObject *encode_predictions(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *header_obj, *models_obj, *tail_obj, *objs[9];
    if (!PyArg_ParseTuple(args, "SOOOSOOOSOOO", &header_obj, &objs[0], &objs[1], &objs[2], &models_obj, &objs[3],
                          &objs[4], &objs[5], &tail_obj, &objs[6], &objs[7], &objs[8]))
        return NULL;
    Buf b[9];
    memset(b, 0, sizeof b);
    PyObject *result = NULL;
    const int with_source = objs[6] != Py_None;
    if (with_source != (objs[7] != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "partitions and offsets: both or neither");
        return NULL;
    }
    /* n from id_start (int64); id_buf is bytes of any length, checked per row below. */
    if (get_buf(objs[1], &b[1], 8, 0, 0, "id_start") < 0) goto done;
    const Py_ssize_t n = b[1].view.len / 8;
    static const char *names[] = {"id_buf", "id_start", "id_len", "scores", "flags", "event_ts", "partitions",
                                  "offsets", "ends"};
    const Py_ssize_t sizes[] = {1, 8, 8, 4, 1, 8, 4, 8, 8};
    for (int k = 0; k < 9; k++) {
        if (k == 1 || ((k == 6 || k == 7) && !with_source)) continue;
        if (get_buf(objs[k], &b[k], sizes[k], k == 0 ? 0 : n, k == 8, names[k]) < 0) goto done;
    }
    const unsigned char *id_buf = b[0].view.buf, *flags = b[4].view.buf;
    const int64_t *id_start = b[1].view.buf, *id_len = b[2].view.buf, *event_ts = b[5].view.buf;
    const float *scores = b[3].view.buf;
    const int32_t *partitions = with_source ? b[6].view.buf : NULL;
    const int64_t *offsets = with_source ? b[7].view.buf : NULL;
    int64_t *ends = b[8].view.buf;
    const Py_ssize_t header_size = PyBytes_GET_SIZE(header_obj), models_size = PyBytes_GET_SIZE(models_obj);
    const Py_ssize_t tail_size = PyBytes_GET_SIZE(tail_obj);
    const Py_ssize_t fixed = header_size + models_size + 5 + tail_size;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (id_start[i] < 0 || id_len[i] < 0 || id_start[i] + id_len[i] > b[0].view.len) {
            PyErr_Format(PyExc_ValueError, "row %zd: event_id bytes out of id_buf", i);
            goto done;
        }
        total += fixed + id_len[i] + long_size(event_ts[i]);
        if (with_source) total += long_size(partitions[i]) + long_size(offsets[i]);
        ends[i] = total;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    const char *header = PyBytes_AS_STRING(header_obj), *models = PyBytes_AS_STRING(models_obj);
    const char *tail = PyBytes_AS_STRING(tail_obj);
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(out + at, header, header_size);
        at += header_size;
        memcpy(out + at, id_buf + id_start[i], id_len[i]);
        at += id_len[i];
        memcpy(out + at, models, models_size);
        at += models_size;
        memcpy(out + at, &scores[i], 4);
        out[at + 4] = flags[i] ? 1 : 0;
        at += 5;
        at += put_long(out + at, event_ts[i]);
        memcpy(out + at, tail, tail_size);
        at += tail_size;
        if (with_source) {
            at += put_long(out + at, partitions[i]);
            at += put_long(out + at, offsets[i]);
        }
    }
done:
    release(b, 9);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_events", scan_events, METH_VARARGS, "Fast path of EventDecoder: see stream/_nativecodec.c."},
    {"encode_predictions", encode_predictions, METH_VARARGS, "Fast path of PredictionEncoder: see the C source."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "stream._nativecodec", NULL, -1, methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nativecodec(void) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "stream._nativecodec: big-endian host (Avro floats are little-endian)");
        return NULL;
    }
    return PyModule_Create(&moduledef);
}
